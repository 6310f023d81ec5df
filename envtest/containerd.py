"""A real containerd with its CRI plugin, for the end-to-end tests: started on the test's own
sockets, root and state folders (a temporary folder), runc with the cgroupfs driver, no registry
(the pause and busybox images are built here from Debian's static busybox, or the pause image
from ``../shared/k8s``'s ``pause``, and imported with ``ctr``). Without a CNI configuration pods
use the host network; a node of :mod:`envtest.cluster` gives it its bridge's
(:mod:`envtest.network`).

Everything is torn down even when the test fails: the pods and containers are removed through
the CRI, then containerd is stopped, the shims it started (found by their command line, which
names our socket) are killed by PID, mounts under the temporary folder are unmounted, the test's
cgroup tree is removed and the folder deleted.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

BUSYBOX = "/bin/busybox"
PAUSE_IMAGE = "127.0.0.1:5999/koordtest/pause:1"
BUSYBOX_IMAGE = "127.0.0.1:5999/koordtest/busybox:1"
"""Loopback-named, so that an accidental pull can only reach this machine."""
CGROUP_ROOT = "/sys/fs/cgroup"
CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids")
SHIM_SOCKETS = "/run/containerd/s"
"""Where containerd 1.6 puts its shims' sockets, whatever its state folder."""


def why_not() -> str | None:
    """Why containerd cannot run here; None when it can."""
    if os.geteuid() != 0:
        return "containerd needs root"
    for tool in ("containerd", "ctr", "runc", "containerd-shim-runc-v2"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (scripts/dev.sh test installs containerd and runc)"
    if not _static(BUSYBOX):
        return f"no static {BUSYBOX} (Debian's busybox-static) to build the test images from"
    for c in ("cpu", "memory", "cpuset"):
        if not os.access(os.path.join(CGROUP_ROOT, c), os.W_OK):
            return f"no writable cgroup v1 {c} controller at {CGROUP_ROOT}/{c}"
    return None


def _static(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    return (
        head.startswith(b"\x7fELF") and b"/lib64/ld-linux" not in head and b"ld-linux" not in head
    )


# Images -----------------------------------------------------------------------------------------


def _blob(layout: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    layout.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}"


BUSYBOX_TOOLS = (
    "sh",
    "sleep",
    "cat",
    "dd",
    "head",
    "echo",
    "ls",
    "mkdir",
    "rm",
    "yes",
    "wget",
    "ip",
)


def _layer(pause: str | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        for d in ("bin", "etc", "proc", "sys", "dev", "tmp"):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            t.addfile(info)
        t.add(BUSYBOX, arcname="bin/busybox")
        for name in BUSYBOX_TOOLS:
            link = tarfile.TarInfo(f"bin/{name}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            t.addfile(link)
        if pause is not None:
            t.add(pause, arcname="pause")
    return out.getvalue()


def build_image_archive(path: Path, refs: dict[str, list[str]], pause: str | None = None) -> None:
    """An OCI image layout tar with one image per ref (ref -> its command), all on the same
    busybox layer (with ``pause``, a path to Kubernetes' pause binary, at ``/pause``)."""
    layer = _layer(pause)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    gz = gzip.compress(layer, mtime=0)
    manifests = []
    with tarfile.open(path, "w") as t:
        layer_digest = _blob(t, gz)
        for ref, cmd in refs.items():
            config = json.dumps(
                {
                    "architecture": "amd64",
                    "os": "linux",
                    "config": {"Cmd": cmd, "Env": ["PATH=/bin"]},
                    "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                }
            ).encode()
            cfg_digest = _blob(t, config)
            manifest = json.dumps(
                {
                    "schemaVersion": 2,
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {
                        "mediaType": "application/vnd.oci.image.config.v1+json",
                        "digest": cfg_digest,
                        "size": len(config),
                    },
                    "layers": [
                        {
                            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                            "digest": layer_digest,
                            "size": len(gz),
                        }
                    ],
                }
            ).encode()
            manifests.append(
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": _blob(t, manifest),
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1],
                    },
                    "platform": {"architecture": "amd64", "os": "linux"},
                }
            )
        for name, data in (
            ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
            ("index.json", json.dumps({"schemaVersion": 2, "manifests": manifests}).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


# containerd -------------------------------------------------------------------------------------


CONFIG = """version = 2
root = "{root}/root"
state = "{root}/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp",
]
[grpc]
  address = "{root}/containerd.sock"
[ttrpc]
  address = "{root}/containerd.sock.ttrpc"
[debug]
  level = "info"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # never ask for an OOM score below the test's own (a sandboxed test runner may not lower it)
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{snapshotter}"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{root}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
"""


@dataclass
class Containerd:
    """One containerd on ``root``; :meth:`start`, then :meth:`close` (always)."""

    root: Path
    cgroup_prefix: str = field(default_factory=lambda: f"koordtest-{uuid.uuid4().hex[:12]}")
    snapshotter: str = "native"
    cni_conf_dir: Path | None = None
    """A CNI configuration folder (pods on a network of their own); None: host network only."""
    cni_bin_dir: str = ""
    pause_binary: str | None = None
    """Kubernetes' ``pause`` for the sandbox image; None: busybox's sleep."""
    proc: subprocess.Popen[bytes] | None = None
    _made_run_dirs: list[str] = field(default_factory=list)

    @property
    def socket(self) -> str:
        return str(self.root / "containerd.sock")

    def start(self, timeout: float = 30.0) -> None:
        # containerd makes these for its shims; remove them afterwards only if they were absent
        self._made_run_dirs = [
            d for d in (SHIM_SOCKETS, os.path.dirname(SHIM_SOCKETS)) if not os.path.exists(d)
        ]
        for d in ("root", "state", "opt", "cni/bin", "cni/conf"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        cfg = self.root / "config.toml"
        cfg.write_text(
            CONFIG.format(
                root=self.root,
                pause=PAUSE_IMAGE,
                snapshotter=self.snapshotter,
                cni_bin=self.cni_bin_dir or self.root / "cni/bin",
                cni_conf=self.cni_conf_dir or self.root / "cni/conf",
            )
        )
        log = open(self.root / "containerd.log", "wb")  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(
            ["containerd", "--config", str(cfg)], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not start: {self.log_tail()}")
            time.sleep(0.05)
        archive = self.root / "images.tar"
        pause_cmd = ["/pause"] if self.pause_binary else ["/bin/sleep", "2147483647"]
        build_image_archive(
            archive,
            {PAUSE_IMAGE: pause_cmd, BUSYBOX_IMAGE: ["/bin/sleep", "3600"]},
            pause=self.pause_binary,
        )
        self.import_image(archive)

    def import_image(self, archive: Path) -> None:
        """Import an OCI or Docker archive into the CRI's namespace, unpacked for our
        snapshotter."""
        self.ctr("images", "import", "--snapshotter", self.snapshotter, str(archive))

    def ctr(self, *args: str) -> str:
        out = subprocess.run(
            ["ctr", "--address", self.socket, "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join((self.root / "containerd.log").read_text().splitlines()[-lines:])
        return ""

    def cgroup(self, controller: str, *rel: str) -> Path:
        return Path(CGROUP_ROOT, controller, self.cgroup_prefix, *rel)

    def make_pod_cgroup(self, rel: str) -> None:
        """The pod's cgroup, as the kubelet makes it before RunPodSandbox (a new cpuset is
        empty until its parent's CPUs and memory nodes are copied down)."""
        for c in CONTROLLERS:
            cur = Path(CGROUP_ROOT, c)
            for part in (self.cgroup_prefix, *Path(rel).parts):
                cur = cur / part
                cur.mkdir(exist_ok=True)
                if c == "cpuset":
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        if not (cur / f).read_text().strip():
                            (cur / f).write_text((cur.parent / f).read_text())

    def close(self) -> None:
        """Stop containerd and remove every trace; never raises."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._kill_shims()
        self._kill_cgroup_processes()
        self._unmount()
        self._remove_cgroups()
        shutil.rmtree(self.root, ignore_errors=True)
        for d in self._made_run_dirs:
            with contextlib.suppress(OSError):
                os.rmdir(d)

    def _kill_shims(self) -> None:
        """The shims our containerd started (their command line names our socket), by PID, and
        their sockets (containerd 1.6: ``/run/containerd/s/<sha256(address/namespace/id)>``)."""
        mine = self.socket.encode()
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            with contextlib.suppress(OSError):
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if mine not in args or not any(b"containerd-shim" in a for a in args[:1]):
                    continue
                os.kill(int(pid), signal.SIGKILL)
                if b"-id" in args:
                    cid = args[args.index(b"-id") + 1].decode()
                    key = os.path.join(self.socket, "k8s.io", cid).encode()
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(SHIM_SOCKETS, hashlib.sha256(key).hexdigest()))

    def _kill_cgroup_processes(self) -> None:
        """What still runs in the test's cgroup tree (only our containers run there)."""
        for _ in range(20):
            pids: set[int] = set()
            for c in CONTROLLERS:
                top = Path(CGROUP_ROOT, c, self.cgroup_prefix)
                for procs in top.rglob("cgroup.procs") if top.is_dir() else ():
                    with contextlib.suppress(OSError):
                        pids.update(int(p) for p in procs.read_text().split())
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def _unmount(self) -> None:
        root = str(self.root)
        for _ in range(3):
            points = []
            with contextlib.suppress(OSError):
                for line in Path("/proc/self/mountinfo").read_text().splitlines():
                    point = line.split()[4]
                    if point.startswith(root):
                        points.append(point)
            if not points:
                return
            for point in sorted(points, key=len, reverse=True):
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)

    def _remove_cgroups(self) -> None:
        for c in os.listdir(CGROUP_ROOT):
            top = Path(CGROUP_ROOT, c, self.cgroup_prefix)
            if not top.is_dir():
                continue
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
