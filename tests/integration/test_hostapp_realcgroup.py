"""Host applications started with ``koordlet host-app run`` on this machine's cgroup v1 hierarchy,
watched by the real koordlet process.

Everything lives below a unique prefix ``kpytest-<hex>``: the kubepods tree the koordlet is pointed
at (``--cgroup-kube-path kpytest-<hex>/kubepods/``), a BE application in ``host-best-effort`` below
the besteffort QoS cgroup (``cgroupPath.base: KubepodsBesteffort``, where Koordinator's CPU
suppress reaches host applications) and an LS application in ``kpytest-<hex>/
host-latency-sensitive``. Both are busy loops started by the launcher. The ``finally`` kills
the processes the test started and removes the prefix in every v1 hierarchy, children first.

1. The BE application's usage appears in ``/metrics`` (``koordlet_host_application_resource_usage``)
   and it is listed present in ``/debug/workloads``.
2. LS load rises (the LS application spins) with the NodeSLO's suppress threshold on: CPU
   suppress (policy ``cfsQuota``; this node may have only two CPUs, the cpuset policy's floor)
   caps the besteffort cgroup holding the BE application, and its measured usage falls under
   the cap while it keeps running.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from koordlet.hostapp import V1_CONTROLLERS
from tests.daemon import one_value
from tests.daemon.test_daemon_process import Proc, koordlet
from tests.integration.test_collectors_realcgroup import BUSY, CONTROLLERS, PATHS

pytestmark = [
    pytest.mark.realcgroup,
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create cgroups"),
    pytest.mark.skipif(
        not all(os.path.isfile(PATHS.cgroup(c, "tasks")) for c in CONTROLLERS),
        reason="needs the cgroup v1 cpu, cpuacct, cpuset and memory hierarchies",
    ),
]

PERIOD_US = 100_000
"""cpu.cfs_period_us of a new cgroup, the period the suppress quota is computed against."""
KOORDLET = (sys.executable, "-m", "koordlet")
CAP_CORES = 0.5
"""The most the BE application may get once LS load takes a core of this node's CPUs."""


@dataclass
class Prefix:
    """The test's cgroups and processes, for the ``finally``."""

    name: str = field(default_factory=lambda: f"kpytest-{secrets.token_hex(4)}")
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def mkdir(self, rel: str) -> None:
        """Make ``<prefix>/<rel>`` in the controllers the koordlet walks, as the kubelet would."""
        parts = [self.name, *rel.split("/")]
        for controller in CONTROLLERS:
            for depth in range(1, len(parts) + 1):
                path = Path(PATHS.cgroup(controller, *parts[:depth]))
                if path.is_dir():
                    continue
                path.mkdir()
                if controller == "cpuset":  # a new v1 cpuset is empty until told
                    for f in ("cpuset.mems", "cpuset.cpus"):
                        (path / f).write_text((path.parent / f).read_text().strip())

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        for controller in {*CONTROLLERS, *V1_CONTROLLERS}:
            top = PATHS.cgroup(controller, self.name)
            if not os.path.isdir(top):
                continue
            for dirpath, _, _ in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
                for _attempt in range(50):  # a killed task leaves its cgroup a moment later
                    try:
                        os.rmdir(dirpath)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.1)


@pytest.fixture
def prefix() -> Iterator[Prefix]:
    made = Prefix()
    try:
        yield made
    finally:
        made.cleanup()


def nodeslo(prefix: str, *, suppress: bool) -> str:
    return f"""\
apiVersion: slo.koordinator.sh/v1alpha1
kind: NodeSLO
spec:
  resourceUsedThresholdWithBE:
    enable: {str(suppress).lower()}
    cpuSuppressThresholdPercent: 65
    cpuSuppressPolicy: cfsQuota
  hostApplications:
  - name: be-spin
    qos: BE
    priority: koord-batch
    cgroupPath: {{base: KubepodsBesteffort, parentDir: host-best-effort, relativePath: be-spin}}
  - name: ls-spin
    qos: LS
    priority: koord-prod
    cgroupPath: {{parentDir: {prefix}/host-latency-sensitive, relativePath: ls-spin}}
"""


def launch(prefix: Prefix, slo: Path, name: str) -> subprocess.Popen[bytes]:
    """``koordlet host-app run --name NAME -- python -c BUSY``; the busy loop keeps the pid."""
    flags = ["--nodeslo-file", str(slo), "--cgroup-kube-dir", f"{prefix.name}/kubepods/"]
    busy = [sys.executable, "-c", BUSY]
    proc = subprocess.Popen([*KOORDLET, "host-app", "run", *flags, "--name", name, "--", *busy])
    prefix.procs.append(proc)
    return proc


def app_cpu(k: Proc, name: str) -> float | None:
    return one_value(
        k.samples(),
        "koordlet_host_application_resource_usage",
        host_application_name=name,
        resource="cpu",
    )


def settle(what: str, read: Callable[[], float | None], ok: Callable[[float], bool]) -> float:
    """Poll ``read`` for up to 20 s until ``ok`` holds; fail with what was seen."""
    seen: list[float | None] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        value = read()
        seen.append(None if value is None else round(value, 3))
        if value is not None and ok(value):
            return value
        time.sleep(0.5)
    pytest.fail(f"{what}: never reached; seen {seen[-20:]}")


def in_cgroup(pid: int, rel: str) -> bool:
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    mine = {ln.split(":", 2)[1]: ln.split(":", 2)[2] for ln in lines}
    return all(mine.get(c) == "/" + rel for c in ("cpu,cpuacct", "cpu", "memory") if c in mine)


def test_a_launched_be_host_app_is_measured_listed_and_suppressed_when_ls_load_rises(
    prefix: Prefix, tmp_path: Path
) -> None:
    kube = f"{prefix.name}/kubepods"
    for rel in ("kubepods", "kubepods/burstable", "kubepods/besteffort"):
        prefix.mkdir(rel)
    slo = tmp_path / "nodeslo.yaml"
    slo.write_text(nodeslo(prefix.name, suppress=False))
    args = ["--standalone", "--nodeslo-file", str(slo), "--cgroup-kube-path", f"{kube}/"]
    args += ["--collect-res-used-interval-seconds", "1"]
    be_rel = f"{kube}/besteffort/host-best-effort/be-spin"

    with koordlet(KOORDLET, args, tmp_path) as k:
        be = launch(prefix, slo, "be-spin")

        def listed() -> dict[str, Any] | None:
            apps = k.json("/debug/workloads")["host_apps"]
            return next((a for a in apps if a["name"] == "be-spin" and a["present"]), None)

        app = k.until("be-spin listed present", listed, timeout=20)
        assert app["cgroup_dir"] == be_rel
        assert app["qos"] == "BE"
        assert in_cgroup(be.pid, be_rel)
        # Not suppressed yet: it gets what the node's other work leaves it (a shared machine).
        settle("be-spin CPU usage in /metrics", lambda: app_cpu(k, "be-spin"), lambda v: v > 0.1)
        memory = one_value(
            k.samples(),
            "koordlet_host_application_resource_usage",
            host_application_name="be-spin",
            resource="memory",
        )
        assert memory is not None
        assert memory > 0

        # LS load rises, and the suppress threshold is switched on (SIGHUP re-reads the NodeSLO
        # as `systemctl reload koordlet` does). On a busy shared machine the system's own use
        # may already leave the BE side nothing but the floor: the cap below holds either way.
        launch(prefix, slo, "ls-spin")
        slo.write_text(nodeslo(prefix.name, suppress=True))
        k.popen.send_signal(signal.SIGHUP)
        # Measured, not a share: two spinning loops and the helpers' own work share two cores, so
        # what the LS loop gets depends on the machine; the cap below is the behaviour checked.
        settle("ls-spin CPU usage in /metrics", lambda: app_cpu(k, "ls-spin"), lambda v: v > 0.1)
        quota_file = Path(PATHS.cgroup("cpu", kube, "besteffort", "cpu.cfs_quota_us"))

        def quota() -> float:
            return int(quota_file.read_text()) / PERIOD_US

        settle(
            "a CFS quota on the besteffort cgroup under LS load",
            quota,
            lambda cores: 0 < cores <= CAP_CORES,
        )
        settle(
            "be-spin held under the quota",
            lambda: app_cpu(k, "be-spin"),
            lambda v: v <= CAP_CORES + 0.1,
        )
        assert be.poll() is None, "the BE application was suppressed, not killed"
