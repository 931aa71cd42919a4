"""``python -m tests.support.realnode`` (``make e2e-node``): see the package docstring.

Exit 0: every step passed; 1: a step failed (named, with what was seen); 2: not run (what this
machine lacks is said). Each step's time is printed; ``--keep`` leaves the cluster up at the
end (``--down`` takes a kept one down).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.realnode.cluster import Cluster, Failed, missing_tools
from tests.support.realnode.images import Builder
from tests.support.realnode.images import missing_tools as missing_build_tools

REPO = Path(__file__).resolve().parents[3]


SHARED = REPO.parent / "shared" / "k8s"
ARCHIVES = ("kube-1.36.2-linux-amd64.tar.xz", "kube-node-1.36.2-linux-amd64.tar.xz")


def unpack_shared() -> str | None:
    """The binaries of ../shared/k8s's two archives, unpacked (once) into .cache/ and checked
    against their SHA256SUMS; None when the archives are not there."""
    if not all((SHARED / name).is_file() for name in ARCHIVES):
        return None
    target = REPO / ".cache" / "e2e-node-bin"
    if (target / "kubelet").exists() and (target / "etcd").exists():
        return str(target)
    target.mkdir(parents=True, exist_ok=True)
    for name in ARCHIVES:
        with tarfile.open(SHARED / name) as archive:
            members = {Path(m.name).name: m for m in archive.getmembers() if m.isfile()}
            sums = archive.extractfile(members["SHA256SUMS"])
            assert sums is not None
            for line in sums.read().decode().splitlines():
                digest, file = line.split()
                data = archive.extractfile(members[file])
                assert data is not None
                content = data.read()
                if hashlib.sha256(content).hexdigest() != digest:
                    raise SystemExit(f"{SHARED / name}: {file} does not match its SHA256SUMS")
                (target / file).write_bytes(content)
                (target / file).chmod(0o755)
    return str(target)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="leave the cluster up at the end")
    parser.add_argument("--state", default="/var/lib/nvplugin-e2e", help="the cluster's state")
    args = parser.parse_args()
    bin_dir = os.environ.get("NVPLUGIN_E2E_BIN") or unpack_shared()
    if not bin_dir:
        print(
            "e2e-node not run: NVPLUGIN_E2E_BIN must name a directory with kube-apiserver, "
            "kube-controller-manager, kube-scheduler, kubelet, kubectl and etcd (make e2e-node "
            "unpacks them from ../shared/k8s when it is there)",
            file=sys.stderr,
        )
        return 2
    lacking = missing_tools(Path(bin_dir)) + missing_build_tools()
    if lacking:
        print(f"e2e-node not run: this machine lacks {', '.join(lacking)}", file=sys.stderr)
        return 2
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nvplugin-e2e"
    state = Path(args.state)
    total = time.monotonic()

    def step(name: str, work: Callable[[], str]) -> None:
        started = time.monotonic()
        try:
            said = work()
        except Exception as exc:
            problem = str(exc) if isinstance(exc, Failed) else f"{type(exc).__name__}: {exc}"
            print(f"FAILED  {name} ({time.monotonic() - started:.1f} s): {problem}", flush=True)
            raise Failed(problem) from exc
        print(f"ok {time.monotonic() - started:6.1f} s  {name}: {said}", flush=True)

    builder = Builder(cache, REPO)
    images: list[Path] = []
    cluster = Cluster(Path(bin_dir), state, images)

    def build() -> str:
        images.extend(builder.all())
        return ", ".join(p.name for p in images)

    def up() -> str:
        cluster.up()
        return "Ready"

    passed = False
    try:
        step("images: the Dockerfile built with buildah", build)
        step("a one-node cluster up, the node Ready", up)
        from tests.support.realnode.scenarios import Run

        for name, work in Run(cluster).steps():
            step(name, work)
        passed = True
    except Failed:
        print(f"the cluster's logs: {cluster.logs}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            cluster.down(keep_logs=not passed)
    print(f"e2e-node passed in {time.monotonic() - total:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
