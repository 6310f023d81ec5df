"""The daemon whose state directory (a real tmpfs, ``tests/statedisk.py``) turns read-only while
it runs: it keeps writing cgroups, says so in ``/readyz``, ``/metrics`` and ``/debug/summary``,
and writes what it held once the directory is writable again."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from apis.extension import KubeQOS
from koordlet import status
from koordlet.executor.originals import FILE_NAME
from koordlet.qos.framework import Strategy, StrategyContext, StrategyReport
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from koordlet.system.knobs import CPU_SHARES
from tests.daemon import one_value
from tests.daemon.test_daemon_inprocess import UID, make_config, row, running
from tests.fakehost import FakeHost
from tests.statedisk import remount, small_tmpfs


@pytest.fixture
def fake(host_root: Path) -> FakeHost:
    return FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)


@pytest.fixture
def state_fs(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "statefs") as mount:
        yield mount


class GatedShares:
    """Writes the pod's cpu.shares, once allowed to, a new value each round."""

    def __init__(self, ctx: StrategyContext) -> None:
        self.ctx = ctx
        self.name = "gated"
        self.interval = 0.1
        self.allowed = asyncio.Event()
        self.shares = 100

    async def reconcile(self) -> None:
        if not self.allowed.is_set():
            return
        pod = next(iter(self.ctx.workloads().pods.values()))
        self.shares += 1
        await asyncio.wrap_future(
            self.ctx.executor.submit(
                CPU_SHARES, pod.cgroup_dir, self.shares, strategy=self.name, reason="test"
            )
        )
        self.ctx.report(self.name, StrategyReport({}, f"shares {self.shares}"))


async def test_a_state_dir_turned_read_only_keeps_the_daemon_protecting_and_says_so(
    fake: FakeHost, state_fs: Path
) -> None:
    pod_rel, _ = fake.add_pod(UID, KubeQOS.BESTEFFORT)
    shares_file = Path(fake.layout.file("cpu", pod_rel, "cpu.shares"))
    built: list[GatedShares] = []

    def build(ctx: StrategyContext, interval: float) -> Strategy:
        built.append(GatedShares(ctx))
        return built[0]

    cfg = dataclasses.replace(make_config(fake), state_dir=str(state_fs / "koordlet"))
    async with running(cfg, strategies=[row("gated", build)]) as run:
        (strategy,) = built
        await asyncio.to_thread(remount, state_fs, read_only=True)
        try:
            strategy.allowed.set()

            async def written_while_read_only() -> bool:
                text = await asyncio.to_thread(shares_file.read_text)
                return int(text) > 102

            await run.until("cgroup writes on a read-only state dir", written_while_read_only)
            ready_code, readyz = await run.get("/readyz")
            summary = await run.json("/debug/summary")
            samples = await run.samples()
            out = io.StringIO()
            code = await asyncio.to_thread(status.main, ["--addr", cfg.server.addr], out=out)
        finally:
            await asyncio.to_thread(remount, state_fs, read_only=False)

        async def written_again() -> bool:
            _code, text = await run.get("/readyz")
            return text == "ok"

        await run.until("the held records written", written_again)
        after = await run.samples()

    assert ready_code == 200  # protecting: ready, and degraded
    assert "degraded" in readyz
    assert "originals.jsonl cannot be written (writing: Read-only file system)" in readyz
    assert "audit.jsonl cannot be written" in readyz
    assert any("originals.jsonl" in line for line in summary["degraded"])
    assert code == 0
    assert re.search(r"^state dir +.*originals\.jsonl cannot be written", out.getvalue(), re.M)
    errors = one_value(samples, "koordlet_state_write_errors_total", file="originals")
    assert errors is not None
    assert errors >= 1
    assert one_value(samples, "koordlet_state_pending_records", file="originals") == 1
    assert one_value(after, "koordlet_state_pending_records", file="originals") == 0
    assert one_value(after, "koordlet_state_pending_records", file="audit") == 0
    journal = (state_fs / "koordlet" / FILE_NAME).read_text().splitlines()
    (recorded,) = (json.loads(line) for line in journal[1:])
    assert (recorded["knob"], recorded["text"]) == ("cpu_shares", "2")  # the text before
