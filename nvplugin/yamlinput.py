"""Reading YAML that users hand us (config files, node files, pod files), bounded before any
expensive work.

Three inputs have been seen to stop or exhaust a process: a file that never ends (a FIFO, a huge
file), a few hundred bytes of nested aliases that expand to billions of nodes (the "billion
laughs"), and nesting deep enough to overflow the C YAML loader's stack (a segfault, not an
exception). So every file goes through the same steps:

1. :func:`read_text` opens it without blocking, refuses anything but a regular file, reads at most
   :data:`MAX_BYTES` (+1 to tell "too big") and decodes it as UTF-8, naming the byte offset of a
   bad byte.
2. :func:`load` first walks the YAML *event* stream, which libyaml produces iteratively, and stops
   as soon as the nesting passes :data:`MAX_DEPTH` or the document, with every alias expanded,
   passes :data:`MAX_NODES` nodes. Only then is the document built, by a safe loader that also
   refuses duplicate mapping keys (the last one would silently win) and takes merge keys
   (``<<: *anchor``) as PyYAML and Go's YAML libraries do -- a merge is an alias, so the bounds
   count it.
3. Anything that still fails while building (an integer of 5000 digits, say) becomes an
   :class:`~nvplugin.errors.InputError` naming the source: a bad file is always a message and
   exit 2, never a traceback, and never stops a running daemon.
"""

from __future__ import annotations

import os
import stat
from typing import Any

import yaml

from nvplugin.errors import InputError, shortened

MAX_BYTES = 4 * 1024 * 1024
"""Largest input file. A ConfigMap holds at most 1 MiB; the largest node file (128 GPUs with a
pasted ``nvidia-smi topo -m``) is well under 100 KiB."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and sequences. Pod manifests, the deepest input we read, stay
under 20."""
MAX_NODES = 1_000_000
"""Most nodes in a file with every alias expanded: what code walking the loaded value may visit."""

_LOADER: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_text(
    path: str | os.PathLike[str],
    source: str,
    max_bytes: int = MAX_BYTES,
    *,
    within: str | None = None,
) -> str:
    """The text of the regular file at ``path``, bounded; :class:`InputError` prefixed with
    ``source`` (e.g. ``config file /etc/x.yaml``) when it cannot be read. ``within``: see
    :func:`read_bytes`."""
    return decode(read_bytes(path, source, max_bytes, within=within), source, max_bytes)


def read_bytes(
    path: str | os.PathLike[str],
    source: str,
    max_bytes: int = MAX_BYTES,
    *,
    within: str | None = None,
) -> bytes:
    """At most ``max_bytes`` + 1 bytes of the regular file at ``path`` (one more: the caller
    tells "too big"); :class:`InputError` prefixed with ``source`` otherwise. With ``within`` (a
    directory) the file must resolve inside it: links among its own entries (a ConfigMap
    volume's ``..data``) are followed, a link out of it is refused unread, and so is one swapped
    in after the check (the opened file's own path is checked again)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    if within is not None:
        path = os.path.realpath(path)
        if not inside(path, within):
            raise InputError(f"{source}: resolves outside {within}; refused unread")
        flags |= os.O_NOFOLLOW  # no link left in a resolved path: one swapped in is refused
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InputError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{source}: is a directory, not a file") from None
    except OSError as exc:
        raise InputError(f"{source}: cannot read it: {exc.strerror or exc}") from None
    try:
        # Checked on the descriptor before wrapping it: os.fdopen refuses a directory itself.
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise InputError(f"{source}: is a directory, not a file")
        if not stat.S_ISREG(mode):
            raise InputError(f"{source}: not a regular file")
        if within is not None and not inside(_opened(fd, str(path)), within):
            raise InputError(f"{source}: resolves outside {within}; refused unread")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(f"{source}: cannot read it: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def inside(path: str, directory: str) -> bool:
    """Whether ``path`` (resolved) lies in ``directory`` (resolved), at any depth."""
    real = os.path.realpath(directory)
    return os.path.commonpath([os.path.realpath(path), real]) == real


def _opened(fd: int, path: str) -> str:
    """The path the kernel says ``fd`` is open on (``path`` where /proc does not say)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return path


def decode(data: bytes, source: str, max_bytes: int = MAX_BYTES) -> str:
    """``data`` as UTF-8 text (a leading BOM dropped), refusing more than ``max_bytes``."""
    if len(data) > max_bytes:
        raise InputError(f"{source}: larger than {max_bytes} bytes; is this the right file?")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{source}: not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}"
        ) from None


def load(text: str, source: str) -> Any:
    """The one YAML document in ``text`` (None when empty), checked against the bounds first."""
    documents = _load(text, source, all_documents=False)
    return documents[0] if documents else None


def load_all(text: str, source: str) -> list[Any]:
    """Every YAML document in ``text`` (``---``-separated), checked against the bounds first."""
    return _load(text, source, all_documents=True)


def _load(text: str, source: str, *, all_documents: bool) -> list[Any]:
    if len(text) > MAX_BYTES:
        raise InputError(f"{source}: larger than {MAX_BYTES} bytes")
    try:
        check_bounds(text, source)
        loader = _StrictLoader(text)
        try:
            if all_documents:
                documents = []
                while loader.check_data():
                    documents.append(loader.get_data())
                return documents
            data = loader.get_single_data()
            return [] if data is None else [data]
        finally:
            loader.dispose()
    except InputError:
        raise
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: {_yaml_problem(exc)}") from None
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as exc:
        # What the constructors raise for values Python refuses (an int of 5000 digits).
        problem = shortened(str(exc), 200) or type(exc).__name__
        raise InputError(f"{source}: not valid YAML: {problem}") from None


def check_bounds(text: str, source: str) -> None:
    """Walk ``text``'s YAML events; :class:`InputError` as soon as nesting passes
    :data:`MAX_DEPTH` or the expanded node count passes :data:`MAX_NODES`.

    The expanded count is what the document would hold with every alias replaced by a copy of
    its anchor: each node counts 1, each alias the size of what it names. Counting stops at the
    first event over a bound, so a bomb costs a few microseconds, not its expansion.
    """
    sizes: dict[str, int] = {}  # anchor -> expanded nodes under it (itself included)
    open_sizes: list[list[Any]] = []  # [anchor, expanded size so far] per open collection
    total = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.CollectionStartEvent):
            if len(open_sizes) >= MAX_DEPTH:
                raise InputError(f"{source}: {_at(event)}nested deeper than {MAX_DEPTH} levels")
            open_sizes.append([event.anchor, 1])
            total += 1
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, size = open_sizes.pop()
            if anchor is not None:
                sizes[anchor] = size
            if open_sizes:
                open_sizes[-1][1] += size
            continue
        elif isinstance(event, yaml.AliasEvent | yaml.ScalarEvent):
            size = sizes.get(event.anchor or "", 1) if isinstance(event, yaml.AliasEvent) else 1
            if isinstance(event, yaml.ScalarEvent) and event.anchor is not None:
                sizes[event.anchor] = 1
            total += size
            if open_sizes:
                open_sizes[-1][1] += size
        else:
            continue
        if total > MAX_NODES:
            raise InputError(
                f"{source}: {_at(event)}more than {MAX_NODES} values once aliases are expanded "
                "(an alias bomb?)"
            )


def _at(event: yaml.Event) -> str:
    mark = event.start_mark
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A parser error as ``line L, column C: not valid YAML: <problem>``, without the snippet of
    the input PyYAML appends (which can be a whole line of any length)."""
    mark = getattr(exc, "problem_mark", None)
    at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    if "exceeded maximum nesting depth" in problem:
        # libyaml's own bound (1000 levels in the libyaml of PyYAML 6.0.4's wheels): its
        # scanner reads a run of flow openers ahead of the events, so on ``[[[[...`` it stops
        # before :func:`check_bounds` has counted MAX_DEPTH of them. Deeper than ours, so ours
        # is what the user is told.
        return f"{at}nested deeper than {MAX_DEPTH} levels"
    if "found character '\\t'" in problem or "found a tab character" in problem:
        problem += (
            " (YAML indents with spaces only; a pasted block with tabs goes under a block "
            "scalar that states its indentation, such as `|2`)"
        )
    return f"{at}not valid YAML: {shortened(problem, 300)}"


MERGE_TAG = "tag:yaml.org,2002:merge"
"""The tag of ``<<``, the merge key: ``<<: *defaults`` or ``<<: [*a, *b]`` copies the keys of
those mappings into this one (YAML 1.1's merge-key type; PyYAML and the Go YAML libraries that
kubectl and NVIDIA's plugin use accept it). Keys written in the mapping itself override merged
ones, and of several mappings merged the first that has a key gives it."""


class _StrictLoader(_LOADER):  # type: ignore[misc]
    """A safe loader that refuses duplicate mapping keys (the last would silently win) and
    accepts merge keys (:data:`MERGE_TAG`).

    A key overridden through a merge is no duplicate: that is what merging is for. So each
    mapping's own keys -- ``<<`` itself included, which may appear once -- are checked before its
    merges are applied, and so is each mapping merged in (one written in place, ``<<: {x: 1}``,
    is never built on its own). PyYAML applies merges by rewriting a mapping's node in place,
    so a node is checked once, before that.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._checked: set[int] = set()  # ids of the mapping nodes whose own keys were checked

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        self._refuse_duplicates(node)
        result: dict[Any, Any] = super().construct_mapping(node, deep=deep)  # merges, builds
        return result

    def flatten_mapping(self, node: Any) -> None:
        for key_node, value_node in node.value:
            if key_node.tag != MERGE_TAG:
                continue
            merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for source in merged:
                if isinstance(source, yaml.MappingNode):
                    self._refuse_duplicates(source)
        super().flatten_mapping(node)

    def _refuse_duplicates(self, node: Any) -> None:
        if not isinstance(node, yaml.MappingNode) or id(node) in self._checked:
            return
        self._checked.add(id(node))
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:
                key: Any = "<<"  # not a value to build: it says what to merge
            else:
                key = self.construct_object(key_node, deep=False)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class reports it
                duplicate = False
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {shortened(repr(key), 80)}", key_node.start_mark
                )
