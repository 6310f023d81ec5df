"""``koordlet reset`` against this machine's real cgroup v1 hierarchy, through the console script.

The test makes its own ``kpytest-reset-<random>/kubepods/besteffort/pod<uid>`` cgroups in the
cpu, cpuset and memory hierarchies (the kubepods root given with ``--cgroup-kube-dir``), writes
them as the daemon's strategies do (through the writer, with the originals journal), then runs
``koordlet reset --dry-run`` and ``koordlet reset`` and reads the kernel's files back. Node-wide
sysctls are a fake ``/proc`` (the boot id comes from there too): the host's are never touched.
Everything made is removed in a ``finally``.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.executor.originals import OriginalsJournal
from koordlet.executor.sysctl import MIN_FREE_KBYTES, SystemFileWriter
from koordlet.executor.writer import CgroupWriter
from koordlet.system.cgroups import CgroupDriver, CgroupVersion, detect_layout
from koordlet.system.host import Host
from koordlet.system.knobs import CPU_CFS_QUOTA, CPU_SHARES, CPUSET_CPUS
from koordlet.system.paths import HostPaths
from tests.daemon import free_port

REAL = HostPaths()
CONTROLLERS = ("cpu", "cpuset", "memory")
SCRIPT = Path(sys.executable).parent / "koordlet"
UID = "5b0e4c1a-0000-4d2d-9e9e-0000000fade0"
BOOT = "9d3e1f00-3333-4a1b-8c2d-000000000003"

pytestmark = [
    pytest.mark.realcgroup,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create cgroups"),
    pytest.mark.skipif(
        not all(os.path.isfile(REAL.cgroup(c, "tasks")) for c in CONTROLLERS),
        reason="needs the cgroup v1 cpu, cpuset and memory hierarchies",
    ),
]


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


@pytest.fixture
def tree() -> Iterator[str]:
    """``kpytest-reset-<hex>/kubepods/besteffort/pod<uid>`` in every controller; the prefix."""
    prefix = f"kpytest-reset-{secrets.token_hex(6)}"
    rels = [prefix, f"{prefix}/kubepods", f"{prefix}/kubepods/besteffort",
            f"{prefix}/kubepods/besteffort/pod{UID}"]  # fmt: skip
    made: list[str] = []
    try:
        for controller in CONTROLLERS:
            for rel in rels:
                path = REAL.cgroup(controller, rel)
                os.mkdir(path)
                made.append(path)
                if controller == "cpuset":  # a new v1 cpuset is empty: take the parent's
                    parent = os.path.dirname(path)
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        with open(os.path.join(path, f), "w") as out:
                            out.write(_read(os.path.join(parent, f)))
        yield prefix
    finally:
        for path in reversed(made):
            if os.path.isdir(path):
                os.rmdir(path)


def koordlet(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "koordlet"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60, check=False)


def test_reset_puts_back_the_real_be_cgroup_and_pod_after_a_dry_run(
    tree: str, tmp_path: Path
) -> None:
    proc = tmp_path / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text(BOOT + "\n")
    (proc / "sys/vm").mkdir(parents=True)
    (proc / "sys/vm/min_free_kbytes").write_text("67584\n")
    paths = HostPaths(REAL.cgroup_root, str(proc), str(tmp_path / "sys"))
    kube = f"{tree}/kubepods/"
    layout = detect_layout(
        paths, version=CgroupVersion.V1, driver=CgroupDriver.CGROUPFS, kube_path=kube
    )
    host = Host(paths, layout)
    state = tmp_path / "state"
    journal = OriginalsJournal(str(state), boot_id=BOOT).load()
    writer = CgroupWriter(host, record_original=journal.record)
    be, pod = f"{tree}/kubepods/besteffort", f"{tree}/kubepods/besteffort/pod{UID}"
    all_cpus = _read(REAL.cgroup("cpuset", be, "cpuset.cpus"))
    pod_shares = _read(REAL.cgroup("cpu", pod, "cpu.shares"))
    writer.write(CPU_CFS_QUOTA, be, 2000, strategy="cpusuppress")  # as a new user saw it
    writer.write(CPUSET_CPUS, pod, "0", strategy="cpusuppress")
    writer.write(CPUSET_CPUS, be, "0", strategy="cpusuppress")
    writer.write(CPU_SHARES, pod, 2, strategy="batchresource")
    SystemFileWriter(paths, record_original=journal.record).write(MIN_FREE_KBYTES, 90000)
    assert _read(REAL.cgroup("cpu", be, "cpu.cfs_quota_us")) == "2000"
    flags = [
        "--standalone", "--nodeslo-file", "", "--cgroup-root-dir", REAL.cgroup_root,
        "--proc-root-dir", str(proc), "--sys-root-dir", str(tmp_path / "sys"),
        "--cgroup-version", "v1", "--cgroup-driver", "cgroupfs", "--cgroup-kube-dir", kube,
        "--state-dir", str(state), "--addr", f"127.0.0.1:{free_port()}",
    ]  # fmt: skip

    dry = koordlet("reset", "--dry-run", *flags)

    assert dry.returncode == 0, dry.stderr
    assert _read(REAL.cgroup("cpu", be, "cpu.cfs_quota_us")) == "2000"  # nothing written
    assert (
        f"would    {REAL.cgroup('cpu', be, 'cpu.cfs_quota_us')} (cpu_cfs_quota): '2000' -> '-1'"
        in dry.stdout
    )

    done = koordlet("reset", *flags)

    assert done.returncode == 0, done.stdout + done.stderr
    assert _read(REAL.cgroup("cpu", be, "cpu.cfs_quota_us")) == "-1"
    assert _read(REAL.cgroup("cpuset", be, "cpuset.cpus")) == all_cpus  # parent first,
    assert _read(REAL.cgroup("cpuset", pod, "cpuset.cpus")) == all_cpus  # then the pod
    assert _read(REAL.cgroup("cpu", pod, "cpu.shares")) == pod_shares
    assert (proc / "sys/vm/min_free_kbytes").read_text().strip() == "67584"
    assert len(OriginalsJournal(str(state), boot_id=BOOT).load()) == 0
    audit = (state / "audit/audit.jsonl").read_text()
    assert '"strategy":"reset"' in audit.replace(" ", "")
