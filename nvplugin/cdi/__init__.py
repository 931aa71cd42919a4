"""The CDI spec nvplugin writes for the names its Allocate responses hand the runtime
(``deviceListStrategy`` ``cdi-annotations``, ``cdi-cri``), from the node it serves, and the check
that every such name resolves in the specs a node has.

- :mod:`~nvplugin.cdi.hostfiles`: what the driver root holds for containers (device nodes with
  their majors and minors, libraries and their sonames, programs, firmware, IPC sockets, the
  hook), read once per spec;
- :mod:`~nvplugin.cdi.spec`: the spec itself, a pure function of the plan and those files;
- :mod:`~nvplugin.cdi.validate`: CDI's schema and rules, and the minimum version a spec needs;
- :mod:`~nvplugin.cdi.registry`: the specs of a node's CDI directories and name resolution;
- :mod:`~nvplugin.cdi.writer`: the spec written atomically, nvplugin's own file only;
- :mod:`~nvplugin.cdi.generate`: the one way ``serve`` and the commands make a node's spec.
"""
