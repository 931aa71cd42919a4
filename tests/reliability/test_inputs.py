"""Hostile input files: each is refused with a message and exit 2, in bounded time and memory, by
the one bounded reader (nvplugin/yamlinput.py) that config, node and pod files go through.

Each case runs the real command in a subprocess whose address space is capped, so a loader that
expanded an alias bomb or recursed into deep nesting would fail the test (MemoryError, a crash or
the timeout), not the machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nvplugin import yamlinput
from nvplugin.config import SCHEMA, SETTINGS, load_config
from nvplugin.config.schema import Invalid
from nvplugin.errors import InputError, describe
from tests.support.hostile import ALIAS_BOMB

MEMORY_CAP = 1 << 30  # bytes of address space for each command
TIMEOUT_S = 60.0  # generous: the refusals take milliseconds; the cap is for a loaded machine

DEEP = "[" * 200_000 + "]" * 200_000
NODE_HEAD = "version: v1\nname: x\n"


# Caps the address space, then becomes ``python -m nvplugin ARGS``. Not a preexec_fn: that forks
# this (gRPC-loaded) test process the slow way, and gRPC's fork handlers in the child can abort it
# before the exec (SIGABRT, "epoll_wait error: Bad file descriptor").
_CAPPED = (
    "import os, resource, sys; "
    f"resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_CAP}, {MEMORY_CAP})); "
    "os.execv(sys.executable, [sys.executable, '-m', 'nvplugin', *sys.argv[1:]])"
)


def _run(command: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPLUGIN_")}
    return subprocess.run(
        [sys.executable, "-c", _CAPPED, command, *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
    )


def _refused(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr[:2000]
    assert len(done.stderr) < 1000, "an error message must not render the input"
    for fragment in fragments:
        assert fragment in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [
        ("alias-bomb", NODE_HEAD + ALIAS_BOMB, "aliases are expanded"),
        ("deep-nesting", NODE_HEAD + "gpus: " + DEEP, "nested deeper than 64 levels"),
        ("huge-integer", NODE_HEAD + "gpus: " + "9" * 5000, "not valid YAML"),
        ("huge-key", NODE_HEAD + "? " + "x" * 100_000 + "\n: 1", "unknown key"),
    ],
)
def test_node_files_refused_in_bounded_time_and_memory(
    tmp_path: Path, name: str, text: str, fragment: str
) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    for command in ("topo", "devices"):
        _refused(_run(command, "--simulate", str(path)), f"node file {path}", fragment)


@pytest.mark.parametrize(
    ("name", "data", "fragment"),
    [
        ("alias-bomb", ("version: v1\n" + ALIAS_BOMB).encode(), "aliases are expanded"),
        ("deep-nesting", ("version: v1\nnvplugin: " + DEEP).encode(), "nested deeper"),
        (
            "huge-integer",
            b"version: v1\nnvplugin:\n  health:\n    enabled: " + b"1" * 5000,
            "digits",
        ),
        ("non-utf8", b"version: v1\nflags:\n  migStrategy: \xff\n", "byte 0xff at offset 34"),
        ("too-big", b"version: v1\n#" + b"x" * yamlinput.MAX_BYTES, "larger than"),
    ],
)
def test_config_files_refused_at_start_with_exit_2(
    tmp_path: Path, name: str, data: bytes, fragment: str
) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(data)
    done = _run("serve", "--config", str(path), "--simulate", "workstation-4gpu")
    _refused(done, f"config file {path}", fragment)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    done = _run("serve", "--config", str(tmp_path), "--simulate", "workstation-4gpu")
    _refused(done, f"config file {tmp_path}: is a directory, not a file")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    done = _run("serve", "--config", str(fifo), "--simulate", "workstation-4gpu")
    _refused(done, f"config file {fifo}: not a regular file")


def test_pod_files_go_through_the_same_bounds(tmp_path: Path) -> None:
    path = tmp_path / "pods.yaml"
    path.write_text("apiVersion: v1\nkind: Pod\nmetadata:\n  " + ALIAS_BOMB.replace("\n", "\n  "))
    done = _run("admit", "--simulate", "workstation-4gpu", str(path))
    _refused(done, "aliases are expanded")


def test_bounds_count_aliases_by_what_they_expand_to() -> None:
    # Aliases are fine while the expansion stays under the bound.
    small = "a: &a [1, 2, 3]\nb: [*a, *a, *a]\n"
    assert yamlinput.load(small, "s") == {"a": [1, 2, 3], "b": [[1, 2, 3]] * 3}
    with pytest.raises(InputError, match="line 7, column 8: more than 1000000 values"):
        yamlinput.load(ALIAS_BOMB, "bomb")


def test_depth_is_counted_in_block_style_too() -> None:
    text = "".join(" " * depth + f"k{depth}:\n" for depth in range(100))
    with pytest.raises(InputError, match="line 65, column 65: nested deeper than 64 levels"):
        yamlinput.load(text, "deep")
    yamlinput.load("".join(" " * depth + f"k{depth}:\n" for depth in range(60)), "fine")


def test_depth_in_flow_style_is_refused_by_one_message() -> None:
    """The libyaml of PyYAML 6.0.4's wheels refuses 1000 levels of ``[`` while scanning ahead of
    the events, before the walk counts 64 of them; with earlier ones the walk refuses them. The
    user is told the same either way."""
    for depth in (65, 1001, 5000):
        with pytest.raises(InputError, match=r"^deep: line 1, column \d+: nested deeper than 64"):
            yamlinput.load("[" * depth + "]" * depth, "deep")
    assert yamlinput.load("[" * 64 + "]" * 64, "fine") is not None


def test_duplicate_keys_are_refused() -> None:
    with pytest.raises(InputError, match="line 2, column 1: not valid YAML: duplicate key 'a'"):
        yamlinput.load("a: 1\na: 2\n", "dup")


# --- merge keys: accepted as PyYAML and Go's YAML libraries accept them --------------------------

MERGES = {
    "one mapping": "d: &d {a: 1, b: 2}\nx:\n  <<: *d\n  b: 3\n",
    "a list, the first wins": "a: &a {k: 1, j: 1}\nb: &b {k: 2, m: 2}\nc:\n  <<: [*a, *b]\n",
    "merged twice": "b: &b {a: 1}\nm: &m\n  <<: *b\n  a: 2\nt: {<<: *m, c: 3}\nu: {<<: [*m, *b]}\n",
    "in place": "x:\n  <<: {a: 1}\n  b: 2\n",
    "in a list": "l:\n- &g {name: A100, memory_mib: 81920}\n- {<<: *g, numa_node: 1}\n",
}


@pytest.mark.parametrize("text", MERGES.values(), ids=MERGES.keys())
def test_merge_keys_load_as_pyyaml_loads_them(text: str) -> None:
    assert yamlinput.load(text, "merge") == yaml.load(text, Loader=yaml.SafeLoader)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("x:\n  <<: {a: 1, a: 2}\n", "line 2, column 14: not valid YAML: duplicate key 'a'"),
        (
            "d: &d {a: 1}\nx:\n  <<: *d\n  <<: *d\n",
            "line 4, column 3: not valid YAML: duplicate key '<<'",
        ),
        (
            "d: &d {a: 1}\nx:\n  <<: *d\n  b: 1\n  b: 2\n",
            "line 5, column 3: not valid YAML: duplicate key 'b'",
        ),
        ("x:\n  <<: 5\n", "expected a mapping or list of mappings for merging"),
    ],
    ids=["inside-a-merged-mapping", "two-merge-keys", "own-keys", "not-a-mapping"],
)
def test_duplicate_keys_stay_refused_with_merges(text: str, where: str) -> None:
    with pytest.raises(InputError, match=re.escape(where)):
        yamlinput.load(text, "dup")


def test_merges_count_as_the_aliases_they_are() -> None:
    bomb = "\n".join(
        [
            "a: &a {k0: 0, k1: 1, k2: 2, k3: 3, k4: 4, k5: 5, k6: 6, k7: 7, k8: 8}",
            *(
                f"{chr(c)}: &{chr(c)} [{', '.join(['{<<: *' + chr(c - 1) + '}'] * 9)}]"
                if c > ord("b")
                else f"b: &b [{', '.join(['{<<: *a}'] * 9)}]"
                for c in range(ord("b"), ord("j"))
            ),
        ]
    )
    with pytest.raises(InputError, match="more than 1000000 values"):
        yamlinput.load(bomb, "bomb")


def test_config_node_and_pod_files_take_merge_keys(tmp_path: Path) -> None:
    """What a file written for NVIDIA's plugin, kubectl or a node may hold: shared blocks."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\n"
        "flags:\n"
        "  migStrategy: none\n"
        "  plugin: &plugin\n"
        "    <<: {passDeviceSpecs: true, deviceListStrategy: envvar, deviceIDStrategy: index}\n"
        "    deviceListStrategy: volume-mounts\n"
    )
    loaded = load_config(str(config))
    assert loaded.pass_device_specs is True and loaded.device_id_strategy == "index"
    assert tuple(loaded.device_list_strategy) == ("volume-mounts",)
    node = tmp_path / "node.yaml"
    node.write_text(
        "version: v1\nname: merged\nnuma_distances: [[10]]\n"
        "cpus: {sockets: 1, cores_per_socket: 4, threads_per_core: 1}\n"
        "gpus:\n"
        "  - &gpu {name: NVIDIA L4, memory_mib: 23034, numa_node: 0,\n"
        "          pci_bus_id: '00000000:01:00.0'}\n"
        "  - {<<: *gpu, pci_bus_id: '00000000:02:00.0'}\n"
        "links: |2\n        GPU0  GPU1\n  GPU0  X     PHB\n  GPU1  PHB   X\n"
        "events: []\n"
    )
    done = _run("devices", "--simulate", str(node), "--output", "json")
    assert done.returncode == 0, done.stderr
    assert [g["pci_bus_id"] for g in json.loads(done.stdout)["gpus"]] == [
        "00000000:01:00.0",
        "00000000:02:00.0",
    ]
    pods = tmp_path / "pods.yaml"
    pods.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: shared}\nspec:\n  containers:\n"
        "  - &main {name: main, image: x, resources: {limits: {nvidia.com/gpu: 1}}}\n"
        "  - {<<: *main, name: side}\n"
    )
    done = _run("admit", "--simulate", str(node), "--output", "json", str(pods))
    assert done.returncode == 0, done.stderr
    (pod,) = json.loads(done.stdout)
    assert pod["admitted"] and [c["name"] for c in pod["containers"]] == ["main", "side"]


def test_describe_stays_short_for_any_value() -> None:
    assert describe(10**5000) == "an integer of about 5001 digits (int)"
    long = describe("x" * 10**6)
    assert len(long) < 200 and "1000002 characters" in long


def _pod(name: str, resources: str) -> str:
    return (
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\n"
        f"spec:\n  containers:\n  - name: main\n    resources: {resources}\n"
    )


@pytest.mark.parametrize(
    ("name", "resources", "fragment"),
    [
        ("huge-gpus", "{limits: {nvidia.com/gpu: 1e999999999}}", "is more than 9223372036854775"),
        ("wrapping-exponent", "{limits: {cpu: 1e4294967297}}", "exponent is out of range"),
        ("endless-exponent", '{limits: {cpu: "1e' + "9" * 1_000_000 + '"}}', "out of range"),
        ("endless-digits", '{limits: {memory: "' + "1" * 3_000_000 + 'x"}}', "not a quantity"),
    ],
)
def test_hostile_quantities_are_refused_at_once(
    tmp_path: Path, name: str, resources: str, fragment: str
) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(_pod(name, resources))
    done = _run("admit", "--simulate", "workstation-4gpu", str(path))
    _refused(done, f'pod "{name}"', fragment)


def test_hostile_quantities_the_api_server_accepts_are_answered_in_bounded_time(
    tmp_path: Path,
) -> None:
    # Each of these once hung `nvplugin admit` (exact arithmetic on 10^999999999) or would.
    huge = "{limits: {cpu: 1e999999999, memory: 1e2147483647}}"
    path = tmp_path / "pods.yaml"
    path.write_text(
        "---\n".join(
            [
                _pod("huge", huge),
                _pod("tiny", "{limits: {cpu: 1e-2147483648, nvidia.com/gpu: 0.9999}}"),
                _pod("long", '{limits: {memory: "' + "9" * 1_000_000 + '"}}'),
                _pod("zeros", '{limits: {memory: 1Gi, cpu: "1' + "0" * 1_000_000 + 'e-1000000"}}'),
            ]
        )
    )
    done = _run(
        "admit",
        "--simulate",
        "workstation-4gpu",
        "--cpu-manager-policy",
        "static",
        "--reserved-cpus",
        "0",
        "--output",
        "json",
        str(path),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = {r["pod"]: r for r in json.loads(done.stdout)}
    # 1e999999999 CPUs: its milli-value saturates, and the kubelet's resource fit refuses it
    # (OutOfcpu) before the CPU manager would have put it in the shared pool.
    assert results["huge"]["reason"] == "OutOfcpu", results
    assert "requested: 9223372036854775807," in results["huge"]["message"]
    assert all(r["admitted"] for name, r in results.items() if name != "huge"), results
    assert len(done.stdout) < 10_000, "the report must not render the quantities"
    assert len(results["tiny"]["containers"][0]["gpu_indices"]) == 1  # 0.9999 GPUs count as 1
    assert len(results["zeros"]["containers"][0]["cpus"]) == 1  # exactly 1: an exclusive CPU


# --- hostile values in a well-formed config: checking raises only InputError, short -----------

_HOSTILE_LEAVES = [
    10**5000,
    -(10**400),
    2**63,
    float("inf"),
    float("nan"),
    "x" * 3_000_000,
    "é" * 100_000,
    "\x00\u202e",
    None,
    True,
    [],
    {},
]


def _nested(depth: int) -> object:
    value: object = "deep"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@pytest.mark.parametrize(
    "value",
    [*_HOSTILE_LEAVES, _nested(60), [10**4000] * 1000],
    ids=[describe(v)[:30] for v in [*_HOSTILE_LEAVES, "nested", "list of huge ints"]],
)
def test_hostile_values_in_every_setting_are_input_errors(value: object) -> None:
    """Each setting, and an unknown key beside them, given a value no sane file holds: checking
    fails only with its own error, whose message stays short (the loader turns it into an
    InputError naming the file), never with another exception."""
    for path in [*SETTINGS, "nvplugin.x" * 3]:
        document: dict[str, object] = {}
        node = document
        *parents, leaf = path.split(".")
        for parent in parents:
            node = node.setdefault(parent, {})  # type: ignore[assignment]
        node[leaf] = value
        try:
            SCHEMA.check(document, "", {}, [])
        except Invalid as exc:
            assert len(exc.message) + len(exc.at) < 1500, path


def test_hostile_values_through_the_loader(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("nvplugin:\n  resourceName: " + "a/" + "b" * 3_000_000 + "\n")
    with pytest.raises(InputError) as caught:
        load_config(str(path))
    assert len(str(caught.value)) < 1000
    path.write_text(
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: "
        + "9" * 4000
        + "}\n"
    )
    with pytest.raises(InputError) as caught:
        load_config(str(path))
    assert "digits" in str(caught.value) and len(str(caught.value)) < 1000
