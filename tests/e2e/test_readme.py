"""The README's shell examples run as written, in the README's order, from the repository's root:
every ``nvplugin`` line of its ``sh`` blocks, with the files the README shows saved under the
names it gives them ("saved as (`my-node.yaml`):"). Lines marked ``# on a GPU node`` need one and
are left out; ``serve`` and ``kubelet`` run forever, so they run together, as the README pairs
them, until the kubelet sees the plugin's GPUs."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent
GPU_ONLY = "# on a GPU node"
_FENCE_RE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_SAVED_AS_RE = re.compile(r"\(`([\w.-]+)`\):\s*$")


def _blocks() -> list[tuple[str, str, str]]:
    """(language, body, the line before the block) for every fenced block, in order."""
    out = []
    for match in _FENCE_RE.finditer(README):
        before = README[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        out.append((match.group(1), match.group(2), before))
    return out


def _files() -> dict[str, str]:
    files = {}
    for _, body, before in _blocks():
        saved = _SAVED_AS_RE.search(before)
        if saved:
            files[saved.group(1)] = body
    return files


def _commands() -> list[str]:
    commands = []
    for language, body, _ in _blocks():
        if language != "sh":
            continue
        for line in body.replace("\\\n", " ").splitlines():
            if line.startswith("nvplugin ") and GPU_ONLY not in line:
                commands.append(" ".join(line.split("#")[0].split()))
    return commands


COMMANDS = _commands()
LONG_RUNNING = ("nvplugin serve ", "nvplugin kubelet ")


@pytest.fixture(scope="module")
def workdir() -> object:
    """A copy of what the README's commands read from the repository's root, plus its files."""
    assert (BIN / "nvplugin").exists(), "the nvplugin command is installed with the package"
    folder = tempfile.mkdtemp(prefix="nvplugin-readme-")
    os.symlink(ROOT / "nvplugin", Path(folder) / "nvplugin")
    for name, body in _files().items():
        Path(folder, name).write_text(body)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPLUGIN_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_the_readme_shows_the_newcomer_path() -> None:
    files = _files()
    assert {"my-node.yaml", "workstation-topo.txt", "workstation-gpus.csv"} <= set(files)
    assert "source .venv/bin/activate" in README
    order = [c.split()[1] for c in COMMANDS]
    assert {"devices", "topo", "node", "preferred", "serve", "kubelet", "admit"} <= set(order)
    # every file a command reads is shown before it, made by an earlier command, or shipped
    made: set[str] = set()
    for command in COMMANDS:
        words = command.split()
        for before, word in zip(["", *words], words, strict=False):
            if before in ("-o", ">"):
                made.add(word)
            elif "/" in word and word.endswith(".yaml"):
                assert (ROOT / word).exists(), word
            elif word.endswith((".yaml", ".txt", ".csv")):
                assert word in files or word in made, f"{command!r}: {word} is not shown before"


@pytest.mark.parametrize(
    "command", [c for c in COMMANDS if not c.startswith(LONG_RUNNING)], ids=lambda c: c[:60]
)
def test_readme_command_runs_as_written(command: str, workdir: str) -> None:
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr


def test_readme_serve_with_its_kubelet(workdir: str) -> None:
    serve = next(c for c in COMMANDS if c.startswith("nvplugin serve ") and "--simulate" in c)
    kubelet = next(c for c in COMMANDS if c.startswith("nvplugin kubelet "))
    written = re.search(r"--device-plugin-dir (\S+)", serve)
    assert written and f"--device-plugin-dir {written.group(1)}" in kubelet
    directory = tempfile.mkdtemp(prefix="nvplugin-readme-dp-")
    processes: list[subprocess.Popen[str]] = []
    lines: queue.Queue[str] = queue.Queue()
    try:
        for command, output in ((serve, subprocess.DEVNULL), (kubelet, subprocess.PIPE)):
            argv = command.replace(written.group(1), directory).split()
            processes.append(
                subprocess.Popen(argv, cwd=workdir, stdout=output, text=True, env=_env())
            )
        stdout = processes[1].stdout
        assert stdout is not None
        threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
        seen: list[str] = []
        while not any("16 devices, 16 healthy" in line for line in seen):
            try:
                seen.append(lines.get(timeout=60))
            except queue.Empty:
                raise AssertionError(f"the kubelet never saw the GPUs: {seen}") from None
        for process in reversed(processes):
            process.send_signal(signal.SIGINT)
            assert process.wait(30) == 0
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        shutil.rmtree(directory, ignore_errors=True)


def test_help_shows_what_a_newcomer_needs() -> None:
    from nvplugin.allocator import POLICY_NAMES
    from nvplugin.node import builtin_names

    def helped(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "nvplugin", *args, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return " ".join(done.stdout.split())

    serve = helped("serve")
    assert all(name in serve for name in builtin_names())
    assert "default /var/lib/kubelet/device-plugins)" in serve
    assert "nvplugin kubelet" in serve
    assert f"[{'|'.join(POLICY_NAMES)}]" in helped("preferred")
    assert "nvplugin/kubelet/samples/" in helped("admit")
    assert "import" in helped("node") and "capture" in helped("node")
