"""Per-node config selection: NVIDIA's config manager's rule (label, DEFAULT_CONFIG, fallback
strategies) and settings, and the config names of a ConfigMap volume."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading

import pytest

from nvplugin.config import load_config
from nvplugin.config.select import (
    MAX_CONFIGS,
    Choice,
    NoConfig,
    Selection,
    available,
    choose,
    config_for,
    digest,
    first_choice,
    read_selection,
)
from nvplugin.errors import InputError
from nvplugin.yamlinput import MAX_BYTES
from tests.support.configmap import ConfigMapVolume
from tests.support.waiting import WAIT_S

TWO = ("a100-40gb", "tesla-t4")


def sel(**kwargs: object) -> Selection:
    return Selection(srcdir="/configs", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("label", "names", "selection", "expected"),
    [
        ("tesla-t4", TWO, sel(), Choice("tesla-t4", "label")),
        ("tesla-t4", TWO, sel(default_config="a100-40gb"), Choice("tesla-t4", "label")),
        (None, TWO, sel(default_config="a100-40gb"), Choice("a100-40gb", "default")),
        ("", TWO, sel(default_config="a100-40gb"), Choice("a100-40gb", "default")),
        (None, (*TWO, "default"), sel(), Choice("default", "fallback-named")),
        (None, ("only",), sel(), Choice("only", "fallback-single")),
        (None, ("only",), sel(fallbacks=("single", "named")), Choice("only", "fallback-single")),
        (None, TWO, sel(fallbacks=("named", "empty")), Choice(None, "fallback-empty")),
        (
            None,
            ("default",),
            sel(fallbacks=("single", "named")),
            Choice("default", "fallback-single"),
        ),
    ],
)
def test_choose(
    label: str | None, names: tuple[str, ...], selection: Selection, expected: Choice
) -> None:
    assert choose(label, names, selection) == expected


@pytest.mark.parametrize(
    ("label", "selection", "reason", "words"),
    [
        ("h100", sel(), "unknown", ["label nvidia.com/device-plugin.config='h100'", "a100-40gb"]),
        (None, sel(default_config="h100"), "unknown", ["DEFAULT_CONFIG 'h100'"]),
        (None, sel(), "no-fallback", ["named,single found none", "tesla-t4"]),
        (None, sel(fallbacks=()), "no-fallback", ["(none)"]),
    ],
)
def test_no_choice_says_why(
    label: str | None, selection: Selection, reason: str, words: list[str]
) -> None:
    with pytest.raises(NoConfig) as caught:
        choose(label, TWO, selection)
    assert caught.value.reason == reason
    for word in words:
        assert word in str(caught.value)


def test_a_configmap_volume_lists_its_keys_not_the_kubelets_entries() -> None:
    volume = ConfigMapVolume({"a100-40gb": "version: v1\n", "tesla-t4": "version: v1\n"})
    assert sorted(os.listdir(volume.path))[:2] == ["..2026_11_24_00_00_00.000000", "..data"]
    assert available(volume.path) == TWO
    volume.update({"tesla-t4": "version: v1\n", "default": "version: v1\n"})
    assert available(volume.path) == ("default", "tesla-t4")
    os.mkdir(os.path.join(volume.path, "subdir"))
    os.symlink("/nonexistent", os.path.join(volume.path, "dangling"))
    assert available(volume.path) == ("default", "tesla-t4")


def test_settings_from_flags_and_environment() -> None:
    assert read_selection({}, {"NODE_LABEL": "x"}) is None  # no directory: off
    env = {
        "CONFIG_FILE_SRCDIR": "/available-configs",
        "NODE_NAME": "node-1",
        "DEFAULT_CONFIG": "a100-40gb",
        "FALLBACK_STRATEGIES": "single, empty",
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
    }
    selection = read_selection({"node_label": "example.com/config"}, env)
    assert selection is not None
    assert selection.srcdir == "/available-configs"
    assert selection.node_label == "example.com/config"
    assert selection.default_config == "a100-40gb"
    assert selection.fallbacks == ("single", "empty")
    assert selection.node_name == "node-1"
    assert selection.access.kubeconfig is None
    assert selection.access.service_host == "10.0.0.1"
    with pytest.raises(InputError, match="unknown strategy 'latest'"):
        read_selection({"fallback_strategies": "named,latest"}, env)
    off = read_selection({}, {"CONFIG_FILE_SRCDIR": "/c"})
    assert off is not None and "NODE_NAME" in (off.api_problem() or "")
    bad = read_selection({"node_name": "Node_1/x"}, env)
    assert bad is not None
    assert "NODE_NAME 'Node_1/x' is not a Kubernetes object name" in (bad.api_problem() or "")


def test_first_choice_serves_the_defaults_when_nothing_can_be_chosen() -> None:
    volume = ConfigMapVolume({"a": "version: v1\n", "b": "flags: {migStrategy: mixed}\n"})
    start = first_choice(Selection(volume.path), lambda path: load_config(path))
    assert start.choice == Choice(None, "none") and start.reason == "no-fallback"
    assert start.config.source is None
    bad = ConfigMapVolume({"default": "flags: {migStrategy: sideways}\n"})
    start = first_choice(Selection(bad.path), lambda path: load_config(path))
    assert start.choice == Choice(None, "none") and start.reason == "invalid"
    assert "sideways" in (start.problem or "")
    assert start.refused is not None and start.refused[0] == Choice("default", "fallback-named")
    good = ConfigMapVolume({"default": "flags: {migStrategy: mixed}\n"})
    start = first_choice(Selection(good.path), lambda path: load_config(path))
    assert start.choice == Choice("default", "fallback-named") and start.problem is None
    assert start.config.mig_strategy == "mixed"
    with pytest.raises(InputError, match="cannot read it"):
        first_choice(Selection("/no/such/dir"), lambda path: load_config(path))


SECRET = "secret-of-the-host: do-not-show-this\n"


def test_a_link_out_of_the_directory_is_no_config_and_never_read() -> None:
    """Before: a config that is a link to a file outside the directory was loaded
    and served, and the outside file's first characters appeared in the error."""
    volume = ConfigMapVolume({"default": "version: v1\n"})
    outside = os.path.join(tempfile.mkdtemp(), "shadow")
    with open(outside, "w") as f:
        f.write(SECRET)
    os.symlink(outside, os.path.join(volume.path, "evil"))
    assert available(volume.path) == ("default",)  # the ..data links stay inside: listed
    load = lambda path: load_config(path, within=volume.path)  # noqa: E731 -- serve's loader
    start = first_choice(Selection(volume.path, default_config="evil"), load)
    assert start.choice == Choice(None, "none") and start.reason == "unknown"
    assert "do-not-show" not in (start.problem or "")
    # Swapped in after the listing: refused unread by the loader and the digest.
    with pytest.raises(InputError, match="resolves outside") as caught:
        load(os.path.join(volume.path, "evil"))
    assert "do-not-show" not in str(caught.value)
    assert digest(os.path.join(volume.path, "evil"), MAX_BYTES, volume.path) is None
    assert digest(os.path.join(volume.path, "default"), MAX_BYTES, volume.path) is not None


def test_a_fifo_config_is_refused_without_waiting_for_a_writer() -> None:
    """Before: a FIFO swapped in for a config wedged config following (its digest
    waited for a writer) and with it SIGTERM."""
    volume = ConfigMapVolume({"default": "version: v1\n"})
    fifo = os.path.join(volume.path, "fifo")
    os.mkfifo(fifo)
    assert available(volume.path) == ("default",)
    results: list[object] = []

    def read() -> None:
        results.append(digest(fifo, MAX_BYTES, volume.path))
        with pytest.raises(InputError, match="not a regular file"):
            load_config(fifo, within=volume.path)
        results.append("refused")

    worker = threading.Thread(target=read, daemon=True)  # a blocked read must not hang the run
    worker.start()
    worker.join(WAIT_S)
    assert results == [None, "refused"]
    with contextlib.suppress(OSError):  # let a wedged reader go (none after the fix: ENXIO)
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.parametrize("count", [1000, 1001])
def test_a_directory_of_more_than_1000_configs_is_refused_naming_the_count(count: int) -> None:
    """Before: only the first 1,001 were read, and an existing config was then
    refused with a message claiming "1000 in all"."""
    directory = tempfile.mkdtemp()
    for i in range(count):
        with open(os.path.join(directory, f"config-{i:04d}"), "w") as f:
            f.write("version: v1\n")
    selection = Selection(directory, default_config=f"config-{count - 1:04d}")
    if count <= MAX_CONFIGS:
        assert len(available(directory)) == count
        assert config_for(None, selection) == Choice(f"config-{count - 1:04d}", "default")
        return
    with pytest.raises(InputError, match=f"holds {count} entries, more than the 1000"):
        config_for(None, selection)
