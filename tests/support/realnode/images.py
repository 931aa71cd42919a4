"""The run's images without a registry, as docker-archive tarballs containerd imports.

- ``localhost/pause:e2e``: the pod sandbox -- the host's static busybox sleeping until SIGTERM;
- ``localhost/busybox:e2e``: the test pods' image, the same busybox;
- ``docker.io/library/python:3.11-slim``: the Dockerfile's base, a debootstrap Debian (minbase,
  python3, CA certificates including the host's extra ones, so that pip works behind a proxy);
  built once and kept in the cache, it is only ever a build input;
- ``localhost/nvplugin:e2e``: the project's Dockerfile, built with buildah (vfs storage, chroot
  isolation: no daemon), every run -- the tree under test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.realnode.cluster import Failed

PAUSE = "localhost/pause:e2e"
BUSYBOX = "localhost/busybox:e2e"
BASE = "docker.io/library/python:3.11-slim"
NVPLUGIN = "localhost/nvplugin:e2e"
PROGRAMS = ("buildah", "debootstrap", "busybox")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def missing_tools() -> list[str]:
    out = [name for name in PROGRAMS if shutil.which(name) is None]
    busybox = shutil.which("busybox")
    if busybox is not None and "statically linked" not in _out("file", "-L", busybox):
        out.append("a static busybox (Debian's busybox-static)")
    return out


class Builder:
    """Builds into ``cache`` (tarballs, buildah's storage) from the tree at ``source``."""

    def __init__(self, cache: Path, source: Path) -> None:
        self.cache = cache
        self.source = source
        self.buildah = [
            "buildah", "--root", str(cache / "buildah"), "--runroot", "/run/nvplugin-e2e-buildah",
            "--storage-driver", "vfs",
        ]  # fmt: skip
        (cache / "images").mkdir(parents=True, exist_ok=True)

    def all(self) -> list[Path]:
        """Every image the cluster runs (the base is a build input only)."""
        return [self.busybox(PAUSE, pause=True), self.busybox(BUSYBOX), self.nvplugin()]

    def busybox(self, name: str, *, pause: bool = False) -> Path:
        tar = self.cache / "images" / f"{name.split('/')[-1].replace(':', '-')}.tar"
        if tar.exists():
            return tar
        with tempfile.TemporaryDirectory() as root:
            for sub in ("bin", "tmp", "etc"):
                os.makedirs(os.path.join(root, sub))
            shutil.copy(shutil.which("busybox") or "", os.path.join(root, "bin", "busybox"))
            for applet in _out("busybox", "--list").split():
                link = os.path.join(root, "bin", applet)
                if not os.path.exists(link):
                    os.symlink("busybox", link)
            Path(root, "etc", "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
            container = self._b("from", "scratch").strip()
            self._b("copy", container, root, "/")
            if pause:
                script = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"
                entry = f'["/bin/sh", "-c", "{script}"]'
                self._b("config", "--env", "PATH=/bin", "--entrypoint", entry, container)
            else:
                self._b("config", "--env", "PATH=/bin", "--cmd", '["sh"]', container)
            self._commit(container, name, tar)
        return tar

    def base(self) -> None:
        """The Dockerfile's base image in buildah's storage (from its tarball, or made)."""
        tar = self.cache / "images" / "python-3.11-slim.tar"
        if not tar.exists():
            self._debootstrap(tar)
        if subprocess.run([*self.buildah, "inspect", "--type", "image", BASE],
                          capture_output=True).returncode:  # fmt: skip
            self._b("pull", "-q", f"docker-archive:{tar}")

    def nvplugin(self) -> Path:
        self.base()
        tar = self.cache / "images" / "nvplugin.tar"
        log = self.cache / "images" / "nvplugin-build.log"
        with open(log, "w") as out:
            done = subprocess.run(
                [
                    *self.buildah, "bud", "-q", "--pull=never", "--isolation", "chroot",
                    "--format", "docker", "-t", NVPLUGIN, "-f", str(self.source / "Dockerfile"),
                    str(self.source),
                ],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        if done.returncode != 0:
            raise Failed(f"building the image failed: {log.read_text()[-3000:]}")
        tar.unlink(missing_ok=True)
        self._b("push", "-q", NVPLUGIN, f"docker-archive:{tar}:{NVPLUGIN}")
        return tar

    def _debootstrap(self, tar: Path) -> None:
        mirror = os.environ.get("DEBIAN_MIRROR") or _apt_mirror()
        if not mirror:
            raise Failed("no Debian mirror for the base image: set DEBIAN_MIRROR")
        with tempfile.TemporaryDirectory() as root:
            done = subprocess.run(
                [
                    "debootstrap", "--variant=minbase",
                    "--include=python3,python3-venv,python-is-python3,ca-certificates",
                    "bookworm", root, mirror,
                ],
                capture_output=True, text=True,
            )  # fmt: skip
            if done.returncode != 0:
                raise Failed(f"debootstrap failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
            extra = Path("/usr/local/share/ca-certificates")
            for cert in extra.glob("*.crt") if extra.is_dir() else ():
                shutil.copy(cert, Path(root, "usr/local/share/ca-certificates"))
            subprocess.run(["chroot", root, "update-ca-certificates"], capture_output=True)
            Path(root, "etc/pip.conf").write_text(
                "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n"
            )
            shutil.rmtree(Path(root, "var/lib/apt/lists"), ignore_errors=True)
            container = self._b("from", "scratch").strip()
            self._b("copy", container, root, "/")
            env = ["--env", f"PATH={PATH}", "--env", "LANG=C.UTF-8"]
            self._b("config", *env, "--cmd", '["python3"]', container)
            self._commit(container, BASE, tar)

    def _commit(self, container: str, name: str, tar: Path) -> None:
        self._b("commit", "-q", "--format", "docker", container, name)
        self._b("rm", container)
        self._b("push", "-q", name, f"docker-archive:{tar}:{name}")

    def _b(self, *args: str) -> str:
        done = subprocess.run([*self.buildah, *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise Failed(f"buildah {args[0]}: {done.stderr.strip()[-2000:]}")
        return done.stdout


def _apt_mirror() -> str | None:
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:"):
                return line.split()[1]
    return None


def _out(*command: str) -> str:
    return subprocess.run(command, capture_output=True, text=True).stdout
