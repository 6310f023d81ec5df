"""A kubelet of a test cluster: its own root folder, ports, cgroup root
(``/sys/fs/cgroup/<controller>/<cgroup_root>/kubepods/...``), an empty resolv.conf, on the
bridge's address, and talking CRI to the run's containerd (or to a proxy in front of it).

The kubelet rewrites a few kernel settings when it starts (``protectKernelDefaults: false``);
:class:`Kubelet` reads them before and puts them back after it stops.
"""

from __future__ import annotations

import contextlib
import subprocess
import textwrap
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from envtest.assets import Assets
from envtest.procs import Proc, free_port

KERNEL_SETTINGS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
"""What the kubelet sets at start (pkg/kubelet/cm/container_manager_linux.go,
setupKernelTunables)."""


@dataclass
class Kubelet:
    assets: Assets
    root: Path
    name: str
    """The Node's name (also ``--hostname-override``: nothing is resolved)."""
    address: str
    """The node IP: the bridge's address."""
    kubeconfig: Path
    runtime_endpoint: str
    """``unix://`` path of the CRI: containerd's, or koord-runtime-proxy's."""
    cgroup_root: str
    """The cgroup the kubelet's ``kubepods`` goes under (one folder name)."""
    extra_config: str = ""
    """More KubeletConfiguration keys (YAML lines)."""
    port: int = 0
    healthz_port: int = 0
    proc: Proc | None = None
    _kernel: dict[str, str] = field(default_factory=dict)

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for name in KERNEL_SETTINGS:
            with contextlib.suppress(OSError):
                self._kernel[name] = Path("/proc/sys", name).read_text().strip()
        for controller in _v1_controllers():
            Path("/sys/fs/cgroup", controller, self.cgroup_root).mkdir(exist_ok=True)
        resolv = self.root / "resolv.conf"
        resolv.write_text("")
        self.port = self.port or free_port(self.address)
        self.healthz_port = self.healthz_port or free_port()
        config = self.root / "kubelet.yaml"
        config.write_text(
            textwrap.dedent(f"""\
            apiVersion: kubelet.config.k8s.io/v1beta1
            kind: KubeletConfiguration
            address: {self.address}
            port: {self.port}
            readOnlyPort: 0
            healthzBindAddress: 127.0.0.1
            healthzPort: {self.healthz_port}
            authentication:
              anonymous: {{enabled: true}}
              webhook: {{enabled: false}}
            authorization: {{mode: AlwaysAllow}}
            cgroupDriver: cgroupfs
            cgroupRoot: /{self.cgroup_root}
            cgroupsPerQOS: true
            enforceNodeAllocatable: [pods]
            failSwapOn: false
            resolvConf: {resolv}
            makeIPTablesUtilChains: false
            protectKernelDefaults: false
            serializeImagePulls: false
            evictionHard:
              memory.available: 100Mi
              nodefs.available: 1%
              imagefs.available: 1%
              nodefs.inodesFree: 1%
            imageGCHighThresholdPercent: 99
            imageGCLowThresholdPercent: 98
            nodeStatusUpdateFrequency: 4s
            syncFrequency: 10s
            fileCheckFrequency: 10s
            shutdownGracePeriod: 0s
            """)
            + self.extra_config
        )
        self.proc = Proc(
            f"kubelet {self.name}",
            [
                self.assets.path("kubelet"),
                f"--config={config}",
                f"--kubeconfig={self.kubeconfig}",
                f"--root-dir={self.root / 'root'}",
                f"--cert-dir={self.root / 'pki'}",
                f"--container-runtime-endpoint={self.runtime_endpoint}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.address}",
                "--v=1",
            ],
            self.root / "kubelet.log",
        ).start()

    def healthy(self) -> bool:
        url = f"http://127.0.0.1:{self.healthz_port}/healthz"
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)

    def stop(self) -> None:
        """Stop the kubelet, unmount what it mounted, put the kernel settings back; never raises."""
        if self.proc is not None:
            self.proc.stop()
        unmount_under(self.root)
        for name, value in self._kernel.items():
            with contextlib.suppress(OSError):
                Path("/proc/sys", name).write_text(value)


def _v1_controllers() -> list[str]:
    return [
        entry.name
        for entry in Path("/sys/fs/cgroup").iterdir()
        if entry.is_dir() and not entry.is_symlink() and (entry / "cgroup.procs").exists()
    ]


def unmount_under(root: Path) -> None:
    """Unmount every mount point under ``root``, deepest first."""
    prefix = str(root)
    for _ in range(3):
        points = []
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/mountinfo").read_text().splitlines():
                point = line.split()[4]
                if point.startswith(prefix):
                    points.append(point)
        if not points:
            return
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def make_shared(mount_point: str) -> bool:
    """Make ``mount_point`` a shared mount (``mount --make-shared``) unless it is one already;
    whether it was changed (the caller makes it private again). A host booted by systemd has
    every mount shared; a DaemonSet asking for ``mountPropagation: Bidirectional`` below it (the
    koordlet's ``/sys/fs``, for resctrl) fails to start where it is not: containerd refuses the
    container ("is mounted on /sys but it is not a shared mount")."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == mount_point:
            optional = fields[6 : fields.index("-")]
            if any(f.startswith("shared:") for f in optional):
                return False
            subprocess.run(["mount", "--make-shared", mount_point], check=True)
            return True
    return False


def make_private(mount_point: str) -> None:
    subprocess.run(["mount", "--make-private", mount_point], capture_output=True, check=False)
