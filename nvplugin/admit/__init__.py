"""``nvplugin admit`` and ``nvplugin demo``: applications over both sides of the device-plugin
API -- the fake kubelet (:mod:`nvplugin.fakekubelet`) in this process, the real plugin as a child
process (:mod:`.process`) -- that learn what the plugin serves through the API alone.
:mod:`.admission` runs pods through them, :mod:`.visible` reads what a container sees,
:mod:`.report` prints the outcome, :mod:`.demo` tells the story on built-in nodes."""
