"""``koord-scheduler extender`` as a process: serves on the address given, stops on SIGTERM; a
second SIGTERM or SIGINT while the stop hangs exits at once (kubeclient.signals, the rule of every
binary)."""

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


async def test_a_second_signal_while_the_stop_hangs_exits_at_once(tmp_path: Path):
    """Informers against an API server that never answers: the first SIGINT asks for a stop,
    which waits on the informers' sync; the second exits at once with 128 + SIGINT."""
    with socket.socket() as stalled:  # listens, never answers
        stalled.bind(("127.0.0.1", 0))
        stalled.listen(16)
        api_port = stalled.getsockname()[1]
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "c", "cluster": {"server": f"http://127.0.0.1:{api_port}"}}
                    ],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        port = free_port()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "scheduler_plugins.cli",
            "extender",
            "--kubeconfig",
            str(kubeconfig),
            "--addr",
            f"127.0.0.1:{port}",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            stderr = proc.stderr
            assert stderr is not None
            seen: list[str] = []

            async def line_with(text: str) -> None:
                async with asyncio.timeout(30):
                    while not any(text in line for line in seen):
                        raw = await stderr.readline()
                        assert raw, f"exited before {text!r}: {seen}"
                        seen.append(raw.decode())

            await line_with("extender serving on")
            proc.send_signal(signal.SIGINT)
            await line_with("SIGINT: stopping")
            proc.send_signal(signal.SIGINT)
            assert await asyncio.wait_for(proc.wait(), 15) == 128 + signal.SIGINT
            seen.append((await stderr.read()).decode())
            assert any("SIGINT again: exiting now" in line for line in seen)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
