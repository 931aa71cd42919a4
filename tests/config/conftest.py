"""Config files for the tests, written to a directory removed afterwards."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture
def write() -> Iterator[Callable[..., str]]:
    """``write(text, name="config.yaml")`` -> the path of a new file holding ``text``."""
    directory = Path(tempfile.mkdtemp(prefix="nvp-config-"))

    def _write(text: str, name: str = "config.yaml") -> str:
        path = directory / name
        path.write_text(text)
        return str(path)

    yield _write
    shutil.rmtree(directory, ignore_errors=True)
