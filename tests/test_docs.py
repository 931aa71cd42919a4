"""Citations resolve inside the repository.

Code, tests, the README, DEVELOPERS.md, the chart and docs/ cite documents and files by their
repository path (``docs/allocation.md#pair-scores``, ``tests/support/reference.py``); every such
path must exist, and an anchor must name a heading of the document. Nothing may point outside the
repository: no sibling folders of a checkout, no bare document names, no section numbers, no
numbered issues of a tracker a clone does not have (a public repository's issue is written
``owner/repository#N``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIPPED_DIRECTORIES = {
    ".git",
    ".venv",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "__pycache__",
    "build",
    "dist",
}
GENERATED = ROOT / "nvplugin" / "api" / "v1beta1"
TEXT_SUFFIXES = {".py", ".pyi", ".md", ".yaml", ".yml", ".tpl", ".txt", ".toml", ".json", ".proto"}
TEXT_NAMES = {"Makefile", "Dockerfile", "run", ".helmignore"}
TOP = ("nvplugin", "tests", "docs", "charts", "bench", "proto")

REPOSITORY_PATH = re.compile(
    r"(?<![\w/.-])((?:" + "|".join(TOP) + r")/[\w./-]*[\w/])(#[\w-]+)?(?![\w*<{])"
)
"""``docs/allocation.md#pair-scores``, ``tests/support/``: a path from the repository's root.
Checked everywhere for ``docs/``, and in Markdown for every top folder (in code, such strings
are often data: globs, paths inside a wheel or a chart)."""
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
DOCUMENT = re.compile(r"(?<![\w/.-])([\w.-]+\.md)\b")
UPWARDS = re.compile(r"(?<![\w/.-])(?:\.\./)+[^\s)'\"`,;]*")
OPTIONAL_OUTSIDE = ("../shared/k8s/",)
"""The one place outside the repository a text may name: where ``make test`` looks for the
real-API tier's Kubernetes binaries (too big for the repository). Used only when it is there;
without it the tier is skipped and said to be."""
OUTSIDE = {
    "a path on one machine": re.compile(r"/work/"),
    "a section number": re.compile("\u00a7"),
    "an issue of a tracker the repository does not have": re.compile(
        r"(?<![\w/-])issues? #?\d+", re.IGNORECASE
    ),
}


def _texts() -> Iterator[Path]:
    for folder, directories, files in os.walk(ROOT):
        directories[:] = sorted(
            d for d in directories if d not in SKIPPED_DIRECTORIES and not d.endswith(".egg-info")
        )
        for name in sorted(files):
            path = Path(folder, name)
            if path.is_relative_to(GENERATED) or path == Path(__file__).resolve():
                continue
            if path.suffix in TEXT_SUFFIXES or name in TEXT_NAMES:
                yield path


TEXTS = list(_texts())


def slug(heading: str) -> str:
    """A heading's anchor, as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(document: Path) -> set[str]:
    return {
        slug(line.lstrip("#"))
        for line in document.read_text().splitlines()
        if re.match(r"#{1,6} ", line)
    }


def _problems(path: Path) -> list[str]:
    text = path.read_text(errors="replace")
    problems = []
    cited: list[tuple[Path, str | None]] = []
    for match in REPOSITORY_PATH.finditer(text):
        if path.suffix == ".md" or match.group(1).startswith("docs/"):
            cited.append((ROOT / match.group(1), match.group(2)))
    if path.suffix == ".md":
        for match in MARKDOWN_LINK.finditer(text):
            target = match.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            file, _, anchor = target.partition("#")
            cited.append((path.parent / file if file else path, f"#{anchor}" if anchor else None))
    for target, anchor in cited:
        shown = f"{target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}"
        if not target.exists():
            problems.append(f"cites {shown}, which does not exist")
        elif anchor is not None and target.suffix == ".md" and anchor[1:] not in anchors(target):
            problems.append(f"cites {shown}{anchor}: no such heading")
    for match in DOCUMENT.finditer(text):
        name = match.group(1)
        if not ((ROOT / name).exists() or (path.parent / name).exists()):
            problems.append(f"names {name} without its repository path (docs/{name}?)")
    for match in UPWARDS.finditer(text):
        if match.group(0).startswith(OPTIONAL_OUTSIDE):
            continue
        target = (path.parent / match.group(0).partition("#")[0]).resolve()
        if not (target.is_relative_to(ROOT) and target.exists()):
            problems.append(f"points outside the repository: {match.group(0)!r}")
    for what, pattern in OUTSIDE.items():
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            problems.append(f"line {line}: {what}: {match.group(0)!r}")
    return problems


def test_the_documents_are_in_the_repository() -> None:
    for name in ("allocation.md", "kubelet-behaviour.md", "architecture.md"):
        assert (ROOT / "docs" / name).is_file(), name
    assert len(TEXTS) > 100


@pytest.mark.parametrize("path", TEXTS, ids=[str(p.relative_to(ROOT)) for p in TEXTS])
def test_citations_resolve_inside_the_repository(path: Path) -> None:
    assert _problems(path) == []


def test_the_checks_catch_what_they_should(tmp_path: Path) -> None:
    bad = tmp_path / "bad.md"
    bad.write_text(
        "See docs/allocation.md#no-such-heading, docs/missing.md, [x](nowhere.md),\n"
        "kubelet-behaviour.md, ../shared/docs, and issue 4 \u00a73. NVIDIA/k8s-device-plugin#1929\n"
        "and docs/allocation.md#pair-scores are fine, as is ../shared/k8s/kube.tar.xz.\n"
    )
    problems = _problems(bad)
    assert problems == [
        "cites docs/allocation.md#no-such-heading: no such heading",
        "cites docs/missing.md, which does not exist",
        f"cites {tmp_path / 'nowhere.md'}, which does not exist",
        "names nowhere.md without its repository path (docs/nowhere.md?)",
        "names kubelet-behaviour.md without its repository path (docs/kubelet-behaviour.md?)",
        "points outside the repository: '../shared/docs'",
        "line 2: a section number: '\u00a7'",
        "line 2: an issue of a tracker the repository does not have: 'issue 4'",
    ]
