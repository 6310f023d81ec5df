"""The real ``koord-descheduler run`` console script as a process, against the fake API server.

No cgroup is touched: the descheduler only talks to the API server. The process wins the Lease,
runs a round that creates a PodMigrationJob (or, with ``--dry-run``, creates nothing and counts
it), serves ``/metrics``, and on SIGTERM stops its term, releases the Lease and exits 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.descheduler.builders import (
    build_node,
    build_pod,
    low_node_load_config,
    node_metric,
    replica_set,
)
from tests.descheduler.fake import DeschedulerFakeApiServer
from tests.descheduler.test_packaging import not_allowed, permission
from tests.kubefake.fixtures import eventually, write_kubeconfig

pytestmark = pytest.mark.daemon

SCRIPT = Path(sys.executable).parent / "koord-descheduler"


@pytest.fixture
async def server() -> AsyncIterator[DeschedulerFakeApiServer]:
    s = DeschedulerFakeApiServer()
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def hot_cluster(server: DeschedulerFakeApiServer) -> None:
    server.put("nodes", build_node("hot", 4000, 8000))
    server.put("nodes", build_node("cold", 8000, 16000))
    owner = ("ReplicaSet", "web", "uid-rs-web")
    pods = [build_pod(f"web-{i}", 1200, 100, "hot", owner=owner) for i in range(3)]
    for p in pods:
        server.put("pods", p)
    rs = replica_set("web", replicas=10, uid="uid-rs-web")
    server.put("replicasets", rs)
    server.objects[("replicasets", "default", "web")]["metadata"]["uid"] = "uid-rs-web"
    for n in ("hot", "cold"):
        server.put("nodemetrics", node_metric(n, pods, updated=time.time() - 5))


def holder(server: DeschedulerFakeApiServer) -> str:
    lease = server.get("leases", "koord-descheduler", "koordinator-system") or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


@asynccontextmanager
async def process(
    server: DeschedulerFakeApiServer,
    tmp_path: Path,
    *flags: str,
    migration: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    doc: dict[str, Any] = low_node_load_config(
        lowThresholds={"cpu": 30},
        highThresholds={"cpu": 60},
        anomalyCondition={"consecutiveAbnormalities": 1},
        migration=migration,
    )
    doc["leaderElection"] = {"leaseDuration": "3s", "renewDeadline": "2s", "retryPeriod": "250ms"}
    cfg = tmp_path / "descheduler.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    kc = write_kubeconfig(tmp_path / "kc", server.url)
    port = free_port()
    log = (tmp_path / "descheduler.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        str(SCRIPT),
        "run",
        f"--kubeconfig={kc}",
        f"--config={cfg}",
        f"--metrics-addr=127.0.0.1:{port}",
        *flags,
        stdout=log,
        stderr=log,
        env={**os.environ, "POD_NAME": "desched-a"},
    )
    log.close()
    try:
        yield proc, port
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def metrics_text(port: int) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        return await r.text()


async def scrape_until(port: int, needle: str) -> str:
    deadline = time.monotonic() + 30
    text = ""
    while time.monotonic() < deadline:
        try:
            text = await metrics_text(port)
        except aiohttp.ClientError:
            text = ""
        if needle in text:
            return text
        await asyncio.sleep(0.1)
    raise AssertionError(f"{needle!r} never in /metrics:\n{text}")


async def test_run_wins_the_lease_migrates_serves_metrics_and_releases_on_sigterm(
    server: DeschedulerFakeApiServer, tmp_path: Path
) -> None:
    hot_cluster(server)
    async with process(server, tmp_path) as (proc, port):
        await eventually(lambda: holder(server).startswith("desched-a_"), within=60)
        await eventually(lambda: len(server.jobs()) == 1, within=60)
        text = await scrape_until(port, 'koord_descheduler_pods_evicted_total{namespace="default"')
        assert 'result="success",strategy="LowNodeLoad"' in text
        assert "koord_descheduler_leader 1.0" in text
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    assert holder(server) == ""  # released on the way out
    log = (tmp_path / "descheduler.log").read_text()
    assert "released lease koordinator-system/koord-descheduler" in log


async def test_dry_run_creates_nothing_and_counts_what_it_would_do(
    server: DeschedulerFakeApiServer, tmp_path: Path
) -> None:
    hot_cluster(server)
    async with process(server, tmp_path, "--dry-run", "--leader-elect=false") as (proc, port):
        text = await scrape_until(port, 'result="dry-run"')
        assert 'strategy="LowNodeLoad"' in text
        assert server.jobs() == []
        assert not [
            r for r in server.writes() if "/reservations" in r.path or "/eviction" in r.path
        ]
        assert server.get("leases", "koord-descheduler", "koordinator-system") is None
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    log = (tmp_path / "descheduler.log").read_text()
    assert "dry run: would migrate default/web-" in log


async def test_every_request_of_a_whole_migration_is_allowed_by_the_packaged_roles(
    server: DeschedulerFakeApiServer, tmp_path: Path
) -> None:
    hot_cluster(server)
    evict_directly = {"defaultJobMode": "EvictDirectly"}
    async with process(server, tmp_path, migration=evict_directly) as (proc, _port):
        await eventually(
            lambda: [(j.get("status") or {}).get("phase") for j in server.jobs()] == ["Succeeded"],
            within=60,
        )
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    used = {permission(r) for r in server.requests}
    assert {
        ("scheduling.koordinator.sh", "podmigrationjobs", "create"),
        ("scheduling.koordinator.sh", "podmigrationjobs", "patch"),
        ("scheduling.koordinator.sh", "podmigrationjobs/status", "update"),
        ("", "pods/eviction", "create"),
        ("coordination.k8s.io", "leases", "update"),
    } <= used
    assert not_allowed(server.requests) == []


async def test_a_bad_config_exits_2_before_touching_the_cluster(
    server: DeschedulerFakeApiServer, tmp_path: Path
) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("deschedulingInterval: soon\n")
    proc = await asyncio.create_subprocess_exec(
        str(SCRIPT),
        "run",
        f"--config={cfg}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert f"{cfg}: deschedulingInterval: not a Go duration: 'soon'" in err.decode()
    assert server.requests == []
