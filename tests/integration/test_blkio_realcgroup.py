"""Real blkio throttling, driven by the real koordlet from a NodeSLO file in standalone mode.

The test makes a loop device over a file of its own, a kubepods-shaped tree under a unique prefix
in this machine's v1 cpu, cpuacct, cpuset, memory and blkio hierarchies, and starts the koordlet
(``--standalone --nodeslo-file``, gate ``BlkIOReconcile``) on it. With
``beClass.blkioQOS.blocks[{name: /dev/loopN, ioCfg: {readBPS: 4 MiB}}]`` the koordlet must write
``7:N 4194304`` to the besteffort cgroup's ``blkio.throttle.read_bps_device`` (resolving the
name through ``/sys/class/block``), a BestEffort pod's process reading the device with
``O_DIRECT`` must be held near 4 MiB/s while a Burstable pod's reads run unthrottled, and when the
NodeSLO drops the block the limit must go. The loop device, processes and cgroups are always
removed (``iotree.Undo``).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from apis.extension import KubeQOS
from koordlet.system.paths import HostPaths
from tests.daemon.test_daemon_process import Proc, koordlet
from tests.integration.iotree import PodTree, Undo, go, loop_device, tools_missing

PATHS = HostPaths()
CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "blkio")
LIMIT = 4 << 20
"""readBPS of the BE class: 4 MiB/s."""
READ_SECONDS = 3.0

READER = """
import mmap, os, sys, time
sys.stdin.readline()
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
size = os.lseek(fd, 0, os.SEEK_END)
buf = mmap.mmap(-1, 256 << 10)  # page-aligned, as O_DIRECT needs
start = time.monotonic()
end = start + float(sys.argv[2])
done = offset = 0
while time.monotonic() < end:
    got = os.preadv(fd, [buf], offset)
    done += got
    offset = (offset + got) % size
print(done / (time.monotonic() - start), flush=True)
"""

pytestmark = [
    pytest.mark.realcgroup,
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for cgroups and loop devices"),
    pytest.mark.skipif(
        not os.path.isfile(PATHS.cgroup("blkio", "blkio.throttle.read_bps_device")),
        reason="needs the cgroup v1 blkio hierarchy with blk-throttle",
    ),
    pytest.mark.skipif(
        not all(os.path.isfile(PATHS.cgroup(c, "tasks")) for c in CONTROLLERS),
        reason="needs the cgroup v1 cpu, cpuacct, cpuset, memory and blkio hierarchies",
    ),
    pytest.mark.skipif(bool(tools_missing("losetup")), reason=tools_missing("losetup")),
]


@pytest.fixture
def undo() -> Iterator[Undo]:
    steps = Undo()
    try:
        yield steps
    finally:
        failed = steps.run()
        assert not failed, f"cleanup failed: {failed}"


def _nodeslo(path: Path, blocks: list[dict[str, object]]) -> None:
    doc = {
        "spec": {
            "resourceQOSStrategy": {"beClass": {"blkioQOS": {"enable": True, "blocks": blocks}}}
        }
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    os.replace(tmp, path)  # the file source sees a new inode, never a half-written file


def _read_rate(tree: PodTree, rel: str, device: str, seconds: float) -> float:
    proc = tree.start(rel, READER, device, str(seconds))
    go(proc)
    assert proc.stdout is not None
    out = proc.stdout.readline()
    proc.wait(timeout=30)
    assert proc.returncode == 0, f"reader failed: {out!r}"
    return float(out)


def test_a_besteffort_reader_is_held_near_the_nodeslo_read_bps(undo: Undo, tmp_path: Path) -> None:
    device = loop_device(tmp_path / "disk.img", 64 << 20, undo)
    dev_number = Path(f"/sys/class/block/{Path(device).name}/dev").read_text().strip()
    tree = PodTree.create(PATHS, CONTROLLERS, undo)
    _, _, be_container = tree.add_pod(KubeQOS.BESTEFFORT)
    _, _, ls_container = tree.add_pod(KubeQOS.BURSTABLE)
    be_dir = tree.host.layout.qos_dir(KubeQOS.BESTEFFORT)
    slo = tmp_path / "nodeslo.yaml"
    _nodeslo(slo, [{"name": device, "type": "device", "ioCfg": {"readBPS": LIMIT}}])
    args = [
        "--standalone",
        "--nodeslo-file",
        str(slo),
        "--cgroup-kube-dir",
        f"{tree.prefix}/kubepods/",
        "--feature-gates",
        "BlkIOReconcile=true",
    ]
    with koordlet([sys.executable, "-m", "koordlet"], args, tmp_path) as k:

        def limit_written() -> bool:  # on v1 the BE container's own cgroup holds it too
            return all(
                f"{dev_number} {LIMIT}" in tree.read("blkio", rel, "blkio.throttle.read_bps_device")
                for rel in (be_dir, be_container)
            )

        k.until("the BE read limit", limit_written, timeout=20)

        be_rate = _read_rate(tree, be_container, device, READ_SECONDS)
        ls_rate = _read_rate(tree, ls_container, device, 1.0)
        assert 0.5 * LIMIT <= be_rate <= 1.3 * LIMIT, (
            f"BE read {be_rate / 2**20:.2f} MiB/s, limit {LIMIT / 2**20:.0f} MiB/s"
        )
        assert ls_rate > 3 * LIMIT, (
            f"the unthrottled LS reader got only {ls_rate / 2**20:.2f} MiB/s"
        )

        report = _blkio_report(k)
        assert report["detail"]["targets"]["beClass"]["devices"]["blkio_read_bps"] == {
            dev_number: LIMIT
        }
        audit = k.json("/debug/audit?strategy=blkio&kind=write")["entries"]
        assert any(e["path"].endswith("blkio.throttle.read_bps_device") for e in audit)

        _nodeslo(slo, [])  # the block is dropped: the limit must go

        def limit_removed() -> bool:
            return all(
                tree.read("blkio", rel, "blkio.throttle.read_bps_device").strip() == ""
                for rel in (be_dir, be_container)
            )

        k.until("the BE read limit removed", limit_removed, timeout=20)
        assert re.search(rf"{re.escape(dev_number)} 0", _audit_news(k))


def _blkio_report(k: Proc) -> dict[str, object]:
    deadline = time.monotonic() + 10
    while True:
        last = k.json("/debug/qos")["strategies"]["blkio"]["last_round"]
        if last is not None or time.monotonic() > deadline:
            assert last is not None, "no blkio round reported"
            return last  # type: ignore[no-any-return]
        time.sleep(0.2)


def _audit_news(k: Proc) -> str:
    return "\n".join(e["new"] for e in k.json("/debug/audit?strategy=blkio")["entries"])
