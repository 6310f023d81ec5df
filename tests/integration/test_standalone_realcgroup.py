"""The real koordlet on this machine's cgroup v1 hierarchy, with a kubepods tree made by hand.

A BestEffort pod with one container running a real busy loop is created under a unique prefix
(``kpytest-<hex>/kubepods/``) in the cpu, cpuacct, cpuset and memory controllers; the koordlet is
pointed at that prefix with ``--cgroup-kube-path``. It must find the pod, measure about one core,
and forget pod and series once the tree is deleted. Processes and cgroups made here are always
removed, and nothing else is touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import one_value
from tests.daemon.test_daemon_process import Proc, koordlet

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory")


def _v1_writable() -> str:
    """Empty when this test can run here; else why not."""
    if os.geteuid() != 0:
        return "needs root"
    for c in CONTROLLERS:
        if not (CGROUP_ROOT / c / "cgroup.procs").is_file():
            return f"no cgroup v1 {c} controller at {CGROUP_ROOT / c}"
    return ""


pytestmark = [
    pytest.mark.realcgroup,
    pytest.mark.skipif(bool(_v1_writable()), reason=_v1_writable()),
]


def _make(rel: str) -> None:
    """Make cgroup ``rel`` (and its parents) in every controller; cpusets copy the root's."""
    parts = rel.split("/")
    for c in CONTROLLERS:
        for depth in range(1, len(parts) + 1):
            d = CGROUP_ROOT / c / "/".join(parts[:depth])
            if d.is_dir():
                continue
            d.mkdir()
            if c == "cpuset":
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (d / name).write_text((CGROUP_ROOT / c / name).read_text())


def _remove(top: str) -> None:
    """Remove cgroup ``top`` and everything below it, deepest first, in every controller."""
    for c in CONTROLLERS:
        base = CGROUP_ROOT / c / top
        if not base.is_dir():
            continue
        for dirpath, _, _ in sorted(os.walk(base), key=lambda w: -w[0].count("/")):
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(dirpath)


@contextlib.contextmanager
def busy_loop_in(rel: str) -> Iterator[subprocess.Popen[bytes]]:
    """A process spinning one CPU, moved into cgroup ``rel`` of every controller."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for c in CONTROLLERS:
            (CGROUP_ROOT / c / rel / "cgroup.procs").write_text(f"{proc.pid}\n")
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _entities(proc: Proc) -> set[str]:
    return set(proc.json("/debug/metrics")["entities"])


def test_a_hand_made_besteffort_pod_is_found_measured_and_forgotten(tmp_path: Path) -> None:
    top = f"kpytest-{uuid.uuid4().hex[:12]}"
    uid = str(uuid.uuid4())
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    pod_rel = f"{top}/kubepods/besteffort/pod{uid}"
    ctr_rel = f"{pod_rel}/{cid}"
    args = [
        "--standalone",
        "--nodeslo-file",
        "",
        "--cgroup-kube-path",
        f"{top}/kubepods/",
        "--collect-res-used-interval-seconds",
        "1",
    ]
    try:
        _make(f"{top}/kubepods/burstable")
        _make(ctr_rel)
        with koordlet([sys.executable, "-m", "koordlet"], args, tmp_path) as k:
            with busy_loop_in(ctr_rel):

                def pod_listed() -> dict[str, Any] | None:
                    pods = k.json("/debug/workloads")["pods"]
                    return next((p for p in pods if p["uid"] == uid), None)

                pod = k.until("pod listed", pod_listed, timeout=10)
                assert (pod["qos"], pod["kube_qos"]) == ("BE", "BestEffort")
                assert pod["cgroup_dir"] == pod_rel
                assert [c["cgroup_dir"] for c in pod["containers"]] == [ctr_rel]

                seen: list[float] = []

                def one_core() -> bool:
                    value = one_value(k.samples(), "koordlet_pod_used_cpu_cores", pod_uid=uid)
                    if value is not None:
                        seen.append(round(value, 2))
                    return value is not None and 0.6 <= value <= 1.4

                k.until(f"about one core for the pod (saw {seen})", one_core, timeout=15)
                assert f"pod/{uid}" in _entities(k)

            _remove(top)  # the busy loop is gone: the cgroups are empty and can go

            def forgotten() -> bool:
                if any(p["uid"] == uid for p in k.json("/debug/workloads")["pods"]):
                    return False
                mine = (f"pod/{uid}", f"container/{uid}/")
                return not any(e.startswith(mine) for e in _entities(k))

            k.until("pod and its series gone", forgotten, timeout=10)
            assert k.stop(signal.SIGTERM) == 0
    finally:
        # Processes first (a cgroup with tasks cannot be removed), then the tree.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            _remove(top)
            if not any((CGROUP_ROOT / c / top).exists() for c in CONTROLLERS):
                break
            time.sleep(0.1)
