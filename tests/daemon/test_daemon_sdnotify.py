"""The real ``koordlet`` process under a systemd-like supervisor: ``READY=1`` once every stage
is up, ``WATCHDOG=1`` at half of ``$WATCHDOG_USEC``, ``STOPPING=1`` on SIGTERM, all on a unix
datagram socket the test binds as ``$NOTIFY_SOCKET``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from koordlet.daemon import STAGES
from tests.daemon import free_port
from tests.daemon.test_daemon_process import REPO, STOP_WITHIN

pytestmark = pytest.mark.daemon


def receive_until(sock: socket.socket, wanted: str, deadline: float) -> list[str]:
    """Every message received until one contains the line ``wanted`` (or the deadline)."""
    got: list[str] = []
    while time.monotonic() < deadline:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            data = sock.recv(4096)
        except TimeoutError:
            break
        got.append(data.decode())
        if wanted in data.decode().splitlines():
            break
    return got


def test_koordlet_tells_systemd_it_is_ready_alive_and_stopping(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    env = {**os.environ, "NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "1000000"}
    env.pop("WATCHDOG_PID", None)
    log = tmp_path / "koordlet.log"
    args = [
        sys.executable,
        "-m",
        "koordlet",
        "--standalone",
        "--dry-run",
        "--nodeslo-file",
        "",
        "--state-dir",
        str(tmp_path / "state"),
        "--addr",
        f"127.0.0.1:{free_port()}",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        before_ready = receive_until(sock, "READY=1", time.monotonic() + 30)
        pings = receive_until(sock, "__never__", time.monotonic() + 2.2)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=STOP_WITHIN)
        after = receive_until(sock, "STOPPING=1", time.monotonic() + 2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        sock.close()

    assert any("READY=1" in m.splitlines() for m in before_ready), log.read_text()
    first = f"STATUS=stage 1/{len(STAGES)} executor started"
    assert any(m.startswith(first) for m in before_ready)
    assert sum("WATCHDOG=1" in m.splitlines() for m in pings) >= 3  # every 0.5 s over 2.2 s
    assert code == 0
    assert any("STOPPING=1" in m.splitlines() for m in after)
