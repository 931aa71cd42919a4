"""Per-node configs: which config file of a directory a node runs, chosen by its node label.

The directory is the ConfigMap mounted as a volume: one file per config name (the ConfigMap's
keys), beside the kubelet's own ``..data`` link and ``..<timestamp>`` directory. The names and
rules are NVIDIA's config manager's (``config-manager`` in NVIDIA's device plugin), so a values
file or a DaemonSet written for it means the same here:

- ``CONFIG_FILE_SRCDIR`` (``--config-file-srcdir``): the directory; setting it turns per-node
  selection on;
- ``NODE_LABEL`` (``--node-label``): the label naming the config, by default
  ``nvidia.com/device-plugin.config``;
- ``DEFAULT_CONFIG`` (``--default-config``): the config of a node without the label;
- ``FALLBACK_STRATEGIES`` (``--fallback-strategies``): without a default, tried in order:
  ``named`` (the config called ``default``), ``single`` (the only config), ``empty`` (no config
  file: the built-in defaults); by default ``named,single``;
- ``NODE_NAME`` (``--node-name``, the downward API's ``spec.nodeName``) and ``KUBECONFIG``
  (``--kubeconfig``; else the in-cluster service account) say which Node to read the label from.

:func:`choose` is the rule, pure: a label naming a config -> that config; a label naming none ->
:class:`NoConfig` (the caller keeps the running config); no label -> the default, else the first
fallback that finds one. Reading the selection's own settings (flags > environment) is here too:
only the config package reads the environment.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from nvplugin.config.model import Config
from nvplugin.errors import InputError, show
from nvplugin.kube.kubeconfig import ApiAccess
from nvplugin.yamlinput import MAX_BYTES

DEFAULT_NODE_LABEL = "nvidia.com/device-plugin.config"
FALLBACKS = ("named", "single", "empty")
"""NVIDIA's fallback strategies, the only ones there are."""
DEFAULT_FALLBACKS = ("named", "single")
NAMED_FALLBACK = "default"
"""The config the ``named`` strategy looks for."""
MAX_CONFIGS = 1000
"""Most config names read from the directory (a ConfigMap of 1 MiB holds far fewer)."""

WHY_LABEL = "label"
WHY_DEFAULT = "default"
WHY_NONE = "none"
"""No config could be chosen: the built-in defaults (and flags, environment) are served."""
WHY_RECORD = "last-chosen"
"""Started with the config the node's label chose when the API last answered (the record)."""

RECORD_NAME = "nvplugin-config-choice.json"
"""The record of the last choice made with the node's label known, in the device-plugin
directory: the one host directory the plugin always has, writable, and that outlives its
container."""
RECORD_MAX_BYTES = 4096

FLAGS = {
    "config_file_srcdir": ("config-file-srcdir", "CONFIG_FILE_SRCDIR"),
    "node_label": ("node-label", "NODE_LABEL"),
    "default_config": ("default-config", "DEFAULT_CONFIG"),
    "fallback_strategies": ("fallback-strategies", "FALLBACK_STRATEGIES"),
    "node_name": ("node-name", "NODE_NAME"),
    "kubeconfig": ("kubeconfig", "KUBECONFIG"),
}
"""Each selection setting: its ``serve`` flag and environment variable (NVIDIA's names)."""


@dataclass(frozen=True)
class Selection:
    """The settings of per-node selection (see the module docstring)."""

    srcdir: str
    node_label: str = DEFAULT_NODE_LABEL
    default_config: str | None = None
    fallbacks: tuple[str, ...] = DEFAULT_FALLBACKS
    node_name: str | None = None
    access: ApiAccess = field(default_factory=ApiAccess)

    def api_problem(self) -> str | None:
        """Why the node's label cannot be read (None: it can be tried)."""
        if not self.node_name:
            return "NODE_NAME is not set (the downward API's spec.nodeName)"
        return self.access.problem()


@dataclass(frozen=True)
class Choice:
    """A chosen config: its name in the directory (None: no config file) and why: ``label``,
    ``default``, ``fallback-named``/``-single``/``-empty``, or ``none``."""

    name: str | None
    why: str

    def path(self, srcdir: str) -> str | None:
        return None if self.name is None else os.path.join(srcdir, self.name)

    def describe(self) -> str:
        return f"{self.name or '(no config file)'} ({self.why})"


class NoConfig(Exception):
    """No config can be chosen; ``reason`` is a fixed word for the metric, the message says
    why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def choose(label: str | None, names: tuple[str, ...], selection: Selection) -> Choice:
    """The config for a node whose label is ``label`` (None or "": not set), among ``names``
    (the directory's configs). Raises :class:`NoConfig`."""
    if label:
        if label in names:
            return Choice(label, WHY_LABEL)
        raise NoConfig(
            "unknown",
            f"label {selection.node_label}={show(label)} names no config in "
            f"{selection.srcdir} (configs: {_listing(names)})",
        )
    if selection.default_config:
        if selection.default_config in names:
            return Choice(selection.default_config, WHY_DEFAULT)
        raise NoConfig(
            "unknown",
            f"DEFAULT_CONFIG {show(selection.default_config)} names no config in "
            f"{selection.srcdir} (configs: {_listing(names)})",
        )
    for strategy in selection.fallbacks:
        if strategy == "named" and NAMED_FALLBACK in names:
            return Choice(NAMED_FALLBACK, "fallback-named")
        if strategy == "single" and len(names) == 1:
            return Choice(names[0], "fallback-single")
        if strategy == "empty":
            return Choice(None, "fallback-empty")
    raise NoConfig(
        "no-fallback",
        f"no label {selection.node_label}, no DEFAULT_CONFIG, and the fallback strategies "
        f"{','.join(selection.fallbacks) or '(none)'} found none among the configs in "
        f"{selection.srcdir}: {_listing(names)}",
    )


def _listing(names: tuple[str, ...]) -> str:
    shown = ", ".join(show(name, 60) for name in names[:20])
    more = f", ... ({len(names)} in all)" if len(names) > 20 else ""
    return (shown + more) if names else "none"


def available(srcdir: str) -> tuple[str, ...]:
    """The config names in ``srcdir``, sorted: its regular files (or links to one, as in a
    ConfigMap volume), without the kubelet's ``..`` entries. Raises OSError when the directory
    cannot be read."""
    names = []
    with os.scandir(srcdir) as entries:
        for entry in entries:
            if entry.name.startswith(".."):
                continue
            try:
                if not stat.S_ISREG(os.stat(entry.path).st_mode):
                    continue
            except OSError:  # a dangling link mid-swap
                continue
            names.append(entry.name)
            if len(names) > MAX_CONFIGS:
                break
    return tuple(sorted(names)[:MAX_CONFIGS])


def digest(path: str | None, max_bytes: int) -> str | None:
    """What a config file holds now, as a hash (None: no file, or it cannot be read), to tell a
    content edit from an unrelated change in the directory."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read(max_bytes + 1)).hexdigest()
    except OSError:
        return None


def read_selection(flags: Mapping[str, object], env: Mapping[str, str]) -> Selection | None:
    """The selection settings from ``flags`` (by :data:`FLAGS` key; None or "" = not given) and
    ``env``; None when ``CONFIG_FILE_SRCDIR`` is not set (per-node selection off). Raises
    InputError for a value that cannot work."""

    def value(key: str) -> str | None:
        given = flags.get(key)
        if given not in (None, ""):
            return str(given)
        return env.get(FLAGS[key][1]) or None

    srcdir = value("config_file_srcdir")
    if srcdir is None:
        return None
    if not os.path.isabs(srcdir):
        srcdir = os.path.abspath(srcdir)
    label = value("node_label") or DEFAULT_NODE_LABEL
    fallbacks: tuple[str, ...] = DEFAULT_FALLBACKS
    text = value("fallback_strategies")
    if text is not None:
        fallbacks = tuple(item.strip() for item in text.split(",") if item.strip())
        for item in fallbacks:
            if item not in FALLBACKS:
                raise InputError(
                    f"FALLBACK_STRATEGIES (--fallback-strategies): unknown strategy {show(item)}; "
                    f"the strategies are {', '.join(FALLBACKS)}"
                )
    access = ApiAccess.of(value("kubeconfig"), env)
    return Selection(
        srcdir=srcdir,
        node_label=label,
        default_config=value("default_config"),
        fallbacks=fallbacks,
        node_name=value("node_name"),
        access=access,
    )


@dataclass(frozen=True)
class Start:
    """What ``serve`` starts with under per-node selection: the choice made before the API is
    asked, its file's digest and its config; when that choice cannot be served, the built-in
    defaults, ``problem`` saying why (``reason``: the metric's word) and ``refused`` the choice
    that was tried (with its digest).

    The choice is the one the node's label made when the API last answered (the record, see
    :func:`read_record`) when there is one; else the default or a fallback, and ``wait`` is True
    when the label can be asked for: nothing is served until it answers, as NVIDIA's config
    manager (its init container) holds the plugin back -- a node labelled for sharing must not
    serve whole GPUs for as long as the API is away. ``record``: where the record is kept."""

    choice: Choice
    digest: str | None
    config: Config
    problem: str | None = None
    reason: str | None = None
    refused: tuple[Choice, str | None] | None = None
    wait: bool = False
    record: str | None = None


def first_choice(
    selection: Selection, load: Callable[[str | None], Config], record: str | None = None
) -> Start:
    """The config to start with, before the node's label is known (see :class:`Start`);
    ``record``: the record's path (None: none kept). InputError when the directory cannot be
    read, or the flags and environment alone are bad: nothing to serve then."""
    try:
        names = available(selection.srcdir)
    except OSError as exc:
        raise InputError(
            f"CONFIG_FILE_SRCDIR {selection.srcdir}: cannot read it: {exc.strerror or exc}"
        ) from None
    asks = selection.api_problem() is None
    recorded = read_record(record) if record is not None and asks else None
    if recorded is not None and (recorded.name is None or recorded.name in names):
        start = _start_with(recorded, names, selection, load)
        if start.problem is None:
            return replace(start, record=record)
    start = _start_with(None, names, selection, load)
    return replace(start, wait=asks, record=record)


def _start_with(
    choice: Choice | None,
    names: tuple[str, ...],
    selection: Selection,
    load: Callable[[str | None], Config],
) -> Start:
    """``choice``'s Start (None: the default's, or a fallback's)."""
    none = Choice(None, WHY_NONE)
    if choice is None:
        try:
            choice = choose(None, names, selection)
        except NoConfig as exc:
            return Start(none, None, load(None), str(exc), exc.reason)
    path = choice.path(selection.srcdir)
    hashed = digest(path, MAX_BYTES)
    try:
        config = load(path)
    except InputError as exc:
        return Start(none, None, load(None), str(exc), "invalid", (choice, hashed))
    return Start(choice, hashed, config)


def read_record(path: str) -> Choice | None:
    """The choice recorded at ``path`` (:func:`write_record`), as :data:`WHY_RECORD`; None when
    there is none or it is not one (a regular file of a few bytes holding ``{"config": ...}``:
    anything else is ignored, never followed or waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, RECORD_MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > RECORD_MAX_BYTES:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    name = value.get("config") if isinstance(value, dict) else None
    if name is not None and (not isinstance(name, str) or not name or "/" in name):
        return None
    if isinstance(value, dict) and "config" in value:
        return Choice(name, WHY_RECORD)
    return None


def write_record(path: str, choice: Choice, label: str | None) -> None:
    """Record ``choice``, made with the node's label ``label`` known, at ``path`` (written aside
    and renamed: a reader sees the old record or the new). OSError when it cannot be written."""
    text = json.dumps({"config": choice.name, "why": choice.why, "label": label}) + "\n"
    directory, name = os.path.split(path)
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            os.fchmod(out.fileno(), 0o644)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def config_for(label: str | None, selection: Selection) -> Choice:
    """Which config a node labelled ``label`` gets (``nvplugin devices``/``admit``: an admin
    checks before labelling), as :func:`predict` says."""
    return predict(label, selection)[0]


def predict(label: str | None, selection: Selection) -> tuple[Choice, str | None]:
    """What ``serve`` starting on a node labelled ``label`` runs, and why when it is no config
    at all: a node without the label whose default and fallbacks find none serves the built-in
    defaults (Choice ``none``, and the reason), as :func:`first_choice` makes ``serve`` do.
    InputError when the directory cannot be read, or for a label naming no config (``serve``
    refuses that choice, logging it, and keeps what it runs)."""
    try:
        names = available(selection.srcdir)
    except OSError as exc:
        raise InputError(
            f"--config-file-srcdir {selection.srcdir}: cannot read it: {exc.strerror or exc}"
        ) from None
    try:
        return choose(label, names, selection), None
    except NoConfig as exc:
        if label:
            raise InputError(
                f"{exc}; serve refuses this choice (logged, and counted in "
                "nvplugin_config_rejected_total) and keeps the config it runs"
            ) from None
        return Choice(None, WHY_NONE), str(exc)
