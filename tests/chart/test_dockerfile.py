"""The image's Dockerfile, checked without a Docker engine: its instructions, its build context
(.dockerignore), and — for real — the install step it runs, on exactly the files it copies."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.helm import REPO, render

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return out


def _all(name: str) -> list[str]:
    return [args for word, args in _instructions() if word == name]


def _pyproject() -> dict[str, object]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_slim_python_base_new_enough_for_the_package() -> None:
    (base,) = _all("FROM")
    assert re.fullmatch(r"python:\$\{PYTHON_VERSION\}-slim", base)
    args = dict(a.split("=", 1) for a in _all("ARG"))
    version = tuple(int(p) for p in args["PYTHON_VERSION"].split("."))
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    minimum = re.fullmatch(r">=(\d+)\.(\d+)", project["requires-python"])
    assert minimum is not None
    assert version >= (int(minimum.group(1)), int(minimum.group(2)))


def test_entrypoint_runs_nvplugin_serve() -> None:
    assert [json.loads(a) for a in _all("ENTRYPOINT")] == [
        ["/usr/bin/env", "--ignore-signal=HUP", "nvplugin"]
    ]
    assert [json.loads(a) for a in _all("CMD")] == [["serve"]]
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    assert project["scripts"] == {"nvplugin": "nvplugin.cli:main"}
    # The chart leaves the entrypoint alone and passes `serve ...` as args.
    container = render().container
    assert "command" not in container and container["args"][0] == "serve"


def _probe_as(directory: Path, name: str) -> None:
    """An executable ``name`` in ``directory`` that prints, as JSON, its arguments and what its
    SIGHUP is set to when it starts (what it inherited across exec)."""
    probe = directory / name
    probe.write_text(
        f"#!{sys.executable}\n"
        "import json, signal, sys\n"
        "hup = signal.getsignal(signal.SIGHUP).name\n"
        "print(json.dumps({'argv': sys.argv[1:], 'sighup': hup}))\n"
    )
    probe.chmod(0o755)


def _started(*command: str, path: Path) -> dict[str, object]:
    done = subprocess.run(
        list(command),
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PATH=f"{path}:{os.environ['PATH']}"),
    )
    assert done.returncode == 0, done.stderr
    shown: dict[str, object] = json.loads(done.stdout)
    return shown


@pytest.mark.process
def test_the_images_entrypoint_starts_nvplugin_with_sighup_ignored(tmp_path: Path) -> None:
    """ENTRYPOINT and CMD, run here with a probe in nvplugin's place: nvplugin starts with
    SIGHUP ignored (inherited across exec), so a SIGHUP during the interpreter's start-up,
    before `serve` handles it, cannot kill it."""
    _probe_as(tmp_path, "nvplugin")
    (entrypoint,) = [json.loads(a) for a in _all("ENTRYPOINT")]
    (cmd,) = [json.loads(a) for a in _all("CMD")]
    assert _started(*entrypoint, *cmd, "--simulate", "x", path=tmp_path) == {
        "argv": ["serve", "--simulate", "x"],
        "sighup": "SIG_IGN",
    }


@pytest.mark.process
def test_nvidia_device_plugin_is_serve_started_with_sighup_ignored(tmp_path: Path) -> None:
    """NVIDIA's command name, as NVIDIA's DaemonSets and chart run it: `nvplugin
    nvidia-device-plugin` (serve, with NVIDIA's flags) with the same arguments, from the nvplugin
    beside it, SIGHUP ignored from its first instruction."""
    script = REPO / "nvplugin" / "scripts" / "nvidia-device-plugin"
    shutil.copy2(script, tmp_path / "nvidia-device-plugin")
    _probe_as(tmp_path, "nvplugin")
    shown = _started(
        str(tmp_path / "nvidia-device-plugin"),
        "--mig-strategy=mixed",
        "--fail-on-init-error",
        path=Path("/nonexistent"),
    )
    assert shown == {
        "argv": ["nvidia-device-plugin", "--mig-strategy=mixed", "--fail-on-init-error"],
        "sighup": "SIG_IGN",
    }
    # Installed beside nvplugin: by `make install`, and by the image's install step.
    tool = _pyproject()["tool"]
    assert isinstance(tool, dict)
    assert "nvplugin/scripts/nvidia-device-plugin" in tool["setuptools"]["script-files"]
    assert os.access(Path(sys.executable).parent / "nvidia-device-plugin", os.X_OK)


def test_nvplugin_is_on_the_images_path() -> None:
    # `kubectl exec ... nvplugin probe --socket S` works in the container (the chart's probes
    # are the kubelet's httpGet: they run nothing in it).
    env = " ".join(_all("ENV"))
    assert "PATH=/opt/nvplugin/bin:$PATH" in env
    assert "exec" not in render().container["livenessProbe"]


def test_install_step_is_make_install_without_editable_or_dev_extras() -> None:
    runs = [r for r in _all("RUN") if "pip install" in r]
    assert len(runs) == 1
    (run,) = runs
    assert "python -m venv /opt/nvplugin" in run
    assert "/opt/nvplugin/bin/python -m pip install --upgrade pip" in run
    assert "/opt/nvplugin/bin/python -m pip install /src " in run
    assert " -e " not in run and "--editable" not in run and "[dev]" not in run
    makefile = (REPO / "Makefile").read_text()
    assert "-m venv" in makefile and "pip install -q --upgrade pip" in makefile


def test_files_are_not_root_owned_and_the_default_user_is_root() -> None:
    """root by default, as NVIDIA's image (its static DaemonSets set no user, and only root may
    use the kubelet's directory); the installed files stay an unprivileged user's, read-only;
    the chart still runs it hardened."""
    (run,) = [r for r in _all("RUN") if "pip install" in r]
    assert "chown -R nvplugin:nvplugin /opt/nvplugin" in run
    assert "chmod -R a-w /opt/nvplugin" in run
    (user,) = _all("USER")
    assert user == "0:0"
    assert any("--uid 10001" in r for r in _all("RUN"))
    context = render().container["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True


def _copied() -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY."""
    out = []
    for args in _all("COPY"):
        assert not args.startswith("--from"), "single-stage image expected"
        *sources, dest = args.split()
        out.append((sources, dest))
    return out


def _ignored(path: str) -> bool:
    """Docker's .dockerignore rule, as far as this file uses it: last matching pattern wins."""
    ignored = False
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        pattern = pattern.rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatch(p, pattern[3:]) for p in parts)
        else:
            hit = any(fnmatch.fnmatch(p, pattern) for p in prefixes)
        if hit:
            ignored = not negate
    return ignored


def test_build_context_holds_what_the_copies_need_and_nothing_else() -> None:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    sources = [s for srcs, _ in _copied() for s in srcs]
    assert sorted(sources) == sorted(["pyproject.toml", project["readme"], "nvplugin"])
    for source in sources:
        assert not _ignored(source), source
    assert not _ignored("nvplugin/nodefile/nodes/dgx-a100.yaml")
    for path in (".venv", ".git", "tests", "charts", "bench", "nvplugin/__pycache__/cli.pyc"):
        assert _ignored(path), path


@pytest.fixture(scope="module")
def image_site() -> Iterator[Path]:
    """The package as the image's install step builds it, from only the copied files."""
    work = Path(tempfile.mkdtemp(prefix="nvp-image-"))
    try:
        src = work / "src"
        src.mkdir()
        for sources, dest in _copied():
            assert dest.startswith("/src/")
            for source in sources:
                if dest.endswith("/"):  # files into the directory
                    assert (REPO / source).is_file()
                    shutil.copy2(REPO / source, src / dest.removeprefix("/src/") / source)
                else:  # a directory's content to the destination
                    shutil.copytree(
                        REPO / source,
                        src / dest.removeprefix("/src/"),
                        ignore=lambda d, names: [
                            n for n in names if _ignored(os.path.relpath(Path(d) / n, REPO))
                        ],
                    )
        # Offline: the build backend (setuptools, which the dev extra grpcio-tools requires) comes
        # from this virtualenv, not the index.
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"),
                *("--wheel-dir", str(work / "wheels"), str(src)),
            ],
            check=True,
            capture_output=True,
            timeout=240,
        )
        (wheel,) = (work / "wheels").glob("nvplugin-*.whl")
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile"),
                *("--target", str(work / "site"), str(wheel)),
            ],
            check=True,
            capture_output=True,
            timeout=240,
        )
        yield work / "site"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_installed(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run(
        [sys.executable, *args], env=env, cwd="/", capture_output=True, text=True, timeout=120
    )


@pytest.mark.process
def test_installed_package_is_complete_and_runs(image_site: Path) -> None:
    where = _run_installed(image_site, "-c", "import nvplugin; print(nvplugin.__file__)")
    assert where.stdout.strip() == str(image_site / "nvplugin" / "__init__.py")
    assert (image_site / "nvplugin" / "nodefile" / "nodes" / "dgx-a100.yaml").is_file()
    assert (image_site / "nvplugin" / "api" / "v1beta1" / "api_pb2_grpc.py").is_file()
    entry_points = next(image_site.glob("nvplugin-*.dist-info")) / "entry_points.txt"
    assert "nvplugin = nvplugin.cli:main" in entry_points.read_text()
    # NVIDIA's command, installed into the image's bin beside nvplugin, unchanged.
    script = image_site / "bin" / "nvidia-device-plugin"
    assert os.access(script, os.X_OK)
    assert script.read_text().startswith("#!/usr/bin/env -S --ignore-signal=HUP /bin/sh\n")
    nvidia = _run_installed(image_site, "-m", "nvplugin", "nvidia-device-plugin", "--help")
    assert nvidia.returncode == 0, nvidia.stderr
    assert "--mig-strategy" in nvidia.stdout and "[$MIG_STRATEGY]" in nvidia.stdout
    # The built-in simulated nodes ship as package data: the installed copy can load one.
    devices = _run_installed(image_site, "-m", "nvplugin", "devices", "--simulate", "dgx-a100")
    assert devices.returncode == 0, devices.stderr
    assert len(devices.stdout.strip().splitlines()) >= 8
    probe = _run_installed(image_site, "-m", "nvplugin", "probe", "--socket", "/nonexistent.sock")
    assert probe.returncode == 1
    assert probe.stderr.startswith("error: no plugin socket at /nonexistent.sock")
