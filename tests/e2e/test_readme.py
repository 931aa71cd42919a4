"""The README's shell examples run as written, in the README's order, from the repository's root:
every ``nvplugin`` line of its ``sh`` blocks, with the files the README shows saved under the
names it gives them ("saved as (`my-node.yaml`):"). Lines marked ``# on a GPU node`` need one and
are left out; ``serve`` and ``kubelet`` run forever, so they run together, as the README pairs
them, until the kubelet sees the plugin's GPUs.

And the output the README shows is the output they print: each ``console`` block's ``$ nvplugin
...`` runs and prints what the block shows (a line ``...`` stands for lines left out, `` ... ``
in a line for columns left out), and the demo's transcript is ``nvplugin demo``'s output. The
commands in the sample pod files' comments run from the repository's root too."""

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
    from nvplugin.nodesession import builtin_names

    def helped(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "nvplugin", *args, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        # click wraps after hyphens: "no-\n numa" reads back as "no-numa"
        return " ".join(done.stdout.split()).replace("- ", "-")

    serve = helped("serve")
    assert all(name in serve for name in builtin_names())
    assert "default /var/lib/kubelet/device-plugins)" in serve
    assert "nvplugin kubelet" in serve
    assert f"[{'|'.join(POLICY_NAMES)}]" in helped("preferred")
    assert "nvplugin/fakekubelet/samples/" in helped("admit")
    assert "import" in helped("node") and "capture" in helped("node")


# --- what the README shows them print ----------------------------------------------------------


def _console_examples() -> list[tuple[str, list[str]]]:
    """(command, the lines shown after it) of every ``$ nvplugin`` in a console block."""
    out: list[tuple[str, list[str]]] = []
    for language, body, _ in _blocks():
        if language != "console":
            continue
        for line in body.splitlines():
            if line.startswith("$ "):
                out.append((line[2:], []))
            else:
                assert out, f"console block without a command: {body[:80]!r}"
                out[-1][1].append(line)
    return out


CONSOLE = _console_examples()


def _matches(expected: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` is ``expected`` with its elisions: a line ``...`` stands for any lines
    (none too); `` ... `` inside a line for the columns between its two sides."""
    if not expected:
        return not actual
    first, rest = expected[0], expected[1:]
    if first == "...":
        return any(_matches(rest, actual[n:]) for n in range(len(actual) + 1))
    if not actual:
        return False
    line = actual[0].rstrip()
    if " ... " in first:
        parts = first.split(" ... ")
        at = 0
        for number, part in enumerate(parts):
            found = line.find(part, at)
            if found < 0 or (number == 0 and found != 0):
                return False
            at = found + len(part)
        ok = line.endswith(parts[-1].rstrip())
    else:
        ok = line == first.rstrip()
    return ok and _matches(rest, actual[1:])


def test_the_readme_shows_its_outputs() -> None:
    commands = [command.split()[:2] for command, _ in CONSOLE]
    assert ["nvplugin", "devices"] in commands and ["nvplugin", "migrate"] in commands
    assert ["nvplugin", "preferred"] in commands


@pytest.mark.parametrize(("command", "shown"), CONSOLE, ids=lambda c: str(c)[:60])
def test_readme_output_is_what_the_command_prints(
    command: str, shown: list[str], workdir: str
) -> None:
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"
    actual = (done.stderr + done.stdout).splitlines()
    assert _matches(shown, actual), (
        f"{command}: the README shows\n"
        + "\n".join(shown)
        + "\nbut it prints\n"
        + "\n".join(actual)
    )


def test_elisions_match_what_they_stand_for() -> None:
    assert _matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert _matches(["a", "...", "b"], ["a", "b"])
    assert not _matches(["a", "...", "d"], ["a", "b", "c"])
    assert _matches(["0  GPU-1  A100 ... 3  on"], ["0  GPU-1  A100  80 GB  bus  3  on"])
    assert not _matches(["0  GPU-1 ... 4  on"], ["0  GPU-1  A100  3  on"])


def test_the_demo_transcript_is_what_demo_prints() -> None:
    (transcript,) = [
        body
        for language, body, before in _blocks()
        if language == "text" and "It prints:" in before
    ]
    done = subprocess.run(
        [str(BIN / "nvplugin"), "demo"], capture_output=True, text=True, timeout=300, env=_env()
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == transcript
    acts = [line for line in transcript.splitlines() if line.startswith("== ")]
    assert len(acts) == 4
    assert "four built-in nodes" in README


def _sample_commands() -> list[str]:
    """The ``nvplugin admit`` command in each sample pod file's opening comment."""
    out = []
    for path in sorted((ROOT / "nvplugin" / "fakekubelet" / "samples").glob("*.yaml")):
        header = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break  # the file's opening comment only
            header.append(line[1:].strip())
        text = " ".join(header).replace("\\ ", "")
        out.append(text[text.index("nvplugin admit ") :])
    return out


@pytest.mark.parametrize("command", _sample_commands(), ids=lambda c: c.split()[-1])
def test_sample_comments_run_from_the_repository_root(command: str) -> None:
    done = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=120, env=_env()
    )
    assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"
    assert "admitted" in done.stdout


def test_every_command_that_takes_the_plugins_config_takes_both_spellings() -> None:
    for command in ("serve", "devices", "admit"):
        done = subprocess.run(
            [str(BIN / "nvplugin"), command, "--help"], capture_output=True, text=True, timeout=60
        )
        assert "--config-file, --config FILE" in done.stdout, command
    done = subprocess.run(
        [str(BIN / "nvplugin"), "devices", "--simulate", "dgx-1", "--config-file", "/nonexistent"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "config file /nonexistent" in done.stderr


def test_help_and_readme_say_durations_alike() -> None:
    done = subprocess.run(
        [str(BIN / "nvplugin"), "serve", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "default 0.1s" in " ".join(done.stdout.split())
    assert "`nvplugin.allocationBudget` (`0.1s`)" in README
    assert "100ms" not in README
