"""Where a node file's ``links`` block is in the file's text: why a pasted ``nvidia-smi topo -m``
block is not YAML (:func:`links_hint`), and the file line its first row is on (:func:`block_start`),
so errors in the matrix point into the file."""

from __future__ import annotations

import re

_LINKS_PLAIN_BLOCK_RE = re.compile(r"^links:[ \t]*\|[-+]?[ \t]*(#.*)?$")


def links_hint(text: str) -> str:
    """Why a node file with a pasted matrix may not be YAML, when that is the likely cause.

    YAML takes a ``|`` block's indentation from its first line, and PyYAML refuses a tab right
    after that indentation. ``nvidia-smi topo -m`` starts its header row with a tab (current
    drivers) or indents it further than the rows below it (older ones): either way a paste
    under a plain ``|`` fails, and under ``|2`` (indentation given) it loads.
    """
    lines = text.splitlines()
    for n, line in enumerate(lines):
        if not _LINKS_PLAIN_BLOCK_RE.match(line):
            continue
        body = [b for b in lines[n + 1 :] if b.strip()]
        indents = []
        for row in body:
            indent = len(row) - len(row.lstrip(" "))
            if indent == 0:
                break
            indents.append(indent)
        tab_first = bool(body) and body[0].lstrip(" ").startswith("\t")
        if tab_first or (len(indents) > 1 and indents[0] > min(indents)):
            return (
                f" (line {n + 1}: a pasted nvidia-smi topo -m starts with a tab or with its "
                f"header indented further than its rows; write `links: |2` so that YAML takes "
                f"the indentation from the indicator)"
            )
        break
    return ""


def block_start(text: str) -> tuple[int, str] | None:
    """(0-based line of the links value's first content line, its style) in the file text."""
    import yaml

    depth = 0
    expect_key = False
    key_is_links = False
    for event in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        if isinstance(event, yaml.CollectionStartEvent):
            if depth == 1 and not expect_key and key_is_links:
                return None
            depth += 1
            expect_key = isinstance(event, yaml.MappingStartEvent) and depth == 1
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
            if depth == 1:
                expect_key = True
            continue
        if isinstance(event, yaml.ScalarEvent | yaml.AliasEvent) and depth == 1:
            if expect_key:
                key_is_links = isinstance(event, yaml.ScalarEvent) and event.value == "links"
            elif key_is_links and isinstance(event, yaml.ScalarEvent):
                style = event.style or ""
                mark = event.start_mark
                if mark is None:
                    return None
                first = mark.line + 1 if style in ("|", ">") else mark.line
                return first, style
            expect_key = not expect_key
    return None
