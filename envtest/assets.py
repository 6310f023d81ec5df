"""Where the real Kubernetes binaries are: ``../shared/k8s``'s archive, checked against its sum and
its ``SHA256SUMS``, unpacked once into a cache folder (``$KOORD_ENVTEST_CACHE``, else
``/var/cache/koordinator-py``) and reused while the archive is the same.

``why_not()`` says in one line what is missing; the callers skip with it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARCHIVE_NAME = "kubernetes-node-v1.25.0-alpha.2-linux-amd64.tar.xz"
BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl")
HOST_TOOLS = {
    "etcd": "etcd-server",
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "iptables": "iptables",
}
"""Tools from Debian's packages (tool -> package), installed by ``scripts/dev.sh test``."""
CNI_DIR = "/usr/lib/cni"
"""Debian's containernetworking-plugins."""


def shared_dir() -> Path:
    """``$KOORD_SHARED_K8S``, else ``../shared/k8s`` beside the checkout."""
    env = os.environ.get("KOORD_SHARED_K8S")
    return Path(env) if env else REPO.parent / "shared" / "k8s"


def cache_dir() -> Path:
    return Path(os.environ.get("KOORD_ENVTEST_CACHE", "/var/cache/koordinator-py"))


@dataclass(frozen=True)
class Assets:
    """The unpacked binaries."""

    bin: Path

    def path(self, name: str) -> str:
        return str(self.bin / name)


def why_not(*, node: bool = True) -> str | None:
    """Why a real cluster cannot run here (one line); None when it can. ``node=False`` asks for
    the control plane only (etcd and the API server)."""
    if os.geteuid() != 0:
        return "the real cluster needs root"
    archive = shared_dir() / ARCHIVE_NAME
    if not archive.is_file():
        return f"no {archive} (the real Kubernetes binaries of ../shared/k8s)"
    tools = ["etcd"] + (["containerd", "ctr", "runc", "iptables"] if node else [])
    for tool in tools:
        if shutil.which(tool) is None:
            package = HOST_TOOLS[tool]
            return f"{tool} not installed (Debian's {package}; scripts/dev.sh test installs it)"
    if node:
        for plugin in ("bridge", "host-local", "loopback"):
            if not os.access(os.path.join(CNI_DIR, plugin), os.X_OK):
                return f"no CNI plugin {CNI_DIR}/{plugin} (Debian's containernetworking-plugins)"
        if not os.access("/sys/fs/cgroup/cpu", os.W_OK):
            return "no writable cgroup v1 hierarchy at /sys/fs/cgroup"
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def unpack() -> Assets:
    """The binaries, unpacked and checked (once per archive; concurrent callers wait on a lock).
    Raises RuntimeError when a sum does not match."""
    archive = shared_dir() / ARCHIVE_NAME
    sums = archive.with_name(archive.name + ".sha256")
    want = sums.read_text().split()[0] if sums.is_file() else None
    target = cache_dir() / f"k8s-{(want or _sha256(archive))[:16]}"
    done = target / ".verified"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".k8s.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            if want is not None and _sha256(archive) != want:
                raise RuntimeError(f"{archive}: sha256 does not match {sums}")
            shutil.rmtree(target, ignore_errors=True)
            tmp = target.with_name(target.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            with tarfile.open(archive) as t:
                t.extractall(tmp, filter="data")
            check = subprocess.run(
                ["sha256sum", "--quiet", "-c", "SHA256SUMS"],
                cwd=tmp,
                capture_output=True,
                text=True,
                check=False,
            )
            if check.returncode != 0:
                raise RuntimeError(f"{archive}: SHA256SUMS: {check.stdout}{check.stderr}".strip())
            tmp.rename(target)
            done.touch()
    return Assets(bin=target / "bin")
