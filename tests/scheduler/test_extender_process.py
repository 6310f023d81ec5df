"""``koord-scheduler extender`` as a process: serves on the address given, stops on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
import time
from pathlib import Path

import aiohttp
import yaml

from tests.scheduler.builders import as_list, node, node_metric, pod, ts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_extender_process_filters_over_http_and_exits_0_on_sigterm(tmp_path: Path):
    metric = node_metric("hot", cpu="30")
    metric["status"]["updateTime"] = ts(time.time())
    snap = tmp_path / "cluster.yaml"
    snap.write_text(yaml.safe_dump(as_list(node("hot"), metric, node("cool"))))
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "scheduler_plugins.cli",
        "extender",
        "--snapshot",
        str(snap),
        "--addr",
        f"127.0.0.1:{port}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as session:
            async with asyncio.timeout(30):
                while True:
                    try:
                        async with session.get(base + "/healthz") as resp:
                            if resp.status == 200:
                                break
                    except aiohttp.ClientConnectionError:
                        await asyncio.sleep(0.1)
            body = {"Pod": pod("p", requests={"cpu": "1"}), "NodeNames": ["hot", "cool"]}
            async with session.post(base + "/filter", data=json.dumps(body)) as resp:
                result = await resp.json()
        assert result["NodeNames"] == ["cool"]
        assert result["FailedNodes"] == {
            "hot": "node(s) cpu usage exceed threshold, cpu usage 96% > threshold 65%"
        }
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_bad_snapshot_exits_2_naming_the_file(tmp_path: Path):
    snap = tmp_path / "cluster.yaml"
    snap.write_text(yaml.safe_dump(as_list(node("n1", memory="lots"))))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "scheduler_plugins.cli",
        "extender",
        "--snapshot",
        str(snap),
        "--addr",
        f"127.0.0.1:{free_port()}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert "cluster.yaml: items[0].status.allocatable.memory" in err.decode()
