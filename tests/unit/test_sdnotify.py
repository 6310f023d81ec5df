"""sd_notify against a real unix datagram socket that the test binds, as systemd binds it."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.sdnotify import Notifier, Watchdog, watchdog_interval


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A bound datagram socket standing in for systemd's notification socket."""
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    try:
        yield path, sock
    finally:
        sock.close()


@pytest.fixture
def abstract_listener() -> Iterator[tuple[str, socket.socket]]:
    name = f"kpytest-notify-{os.getpid()}-{os.urandom(4).hex()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    try:
        yield "@" + name, sock
    finally:
        sock.close()


def received(sock: socket.socket) -> list[str]:
    return sock.recv(4096).decode().split("\n")


def test_ready_with_status_arrives_as_one_datagram(listener: tuple[str, socket.socket]) -> None:
    path, sock = listener
    notifier = Notifier({"NOTIFY_SOCKET": path})

    assert notifier.ready("serving on 127.0.0.1:9316") is True

    assert received(sock) == ["READY=1", "STATUS=serving on 127.0.0.1:9316"]


def test_stopping_status_and_watchdog_are_sent_in_order(
    listener: tuple[str, socket.socket],
) -> None:
    path, sock = listener
    notifier = Notifier({"NOTIFY_SOCKET": path})

    notifier.status("stage 3/6\nstates")
    notifier.watchdog()
    notifier.stopping()

    assert received(sock) == ["STATUS=stage 3/6 states"]
    assert received(sock) == ["WATCHDOG=1"]
    assert received(sock) == ["STOPPING=1"]


def test_an_abstract_namespace_socket_is_reached_through_its_at_name(
    abstract_listener: tuple[str, socket.socket],
) -> None:
    name, sock = abstract_listener
    notifier = Notifier({"NOTIFY_SOCKET": name})

    assert notifier.ready() is True

    assert received(sock) == ["READY=1"]


def test_without_notify_socket_every_call_is_a_no_op() -> None:
    notifier = Notifier({})

    assert notifier.enabled is False
    assert notifier.ready("x") is False
    assert notifier.watchdog() is False
    assert notifier.stopping() is False


def test_a_relative_socket_name_is_ignored_as_systemd_never_sets_one() -> None:
    assert Notifier({"NOTIFY_SOCKET": "notify.sock"}).enabled is False


def test_a_socket_nobody_listens_on_answers_false_without_raising(tmp_path: Path) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})

    assert notifier.ready() is False
    assert notifier.watchdog() is False


def test_a_multi_line_assignment_is_refused(listener: tuple[str, socket.socket]) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": listener[0]})

    with pytest.raises(ValueError, match="single KEY=VALUE"):
        notifier.notify("READY=1\nSTATUS=x")


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "4242"}, 0.5),
        ({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval_is_half_the_timeout_for_this_process_only(
    env: dict[str, str], want: float | None
) -> None:
    assert watchdog_interval(env, pid=4242) == want


def test_no_watchdog_is_built_when_systemd_asked_for_none(
    listener: tuple[str, socket.socket],
) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": listener[0]})

    assert Watchdog.from_environ(notifier, {}) is None
    assert Watchdog.from_environ(Notifier({}), {"WATCHDOG_USEC": "2000000"}) is None
    built = Watchdog.from_environ(notifier, {"WATCHDOG_USEC": "2000000"})
    assert built is not None
    assert built.interval == 1.0


async def test_the_watchdog_task_pings_while_the_loop_runs_and_stops_when_cancelled(
    listener: tuple[str, socket.socket],
) -> None:
    path, sock = listener
    sock.setblocking(False)
    watchdog = Watchdog(Notifier({"NOTIFY_SOCKET": path}), 0.01)
    loop = asyncio.get_running_loop()

    task = asyncio.create_task(watchdog.run(), name="test:watchdog")
    try:
        first = await asyncio.wait_for(loop.sock_recv(sock, 64), 5)
        second = await asyncio.wait_for(loop.sock_recv(sock, 64), 5)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    assert (first, second) == (b"WATCHDOG=1", b"WATCHDOG=1")
    assert watchdog.pings >= 2


async def test_an_unhealthy_agent_gets_no_keep_alive_until_it_recovers(
    listener: tuple[str, socket.socket],
) -> None:
    path, sock = listener
    health = {"ok": False}
    watchdog = Watchdog(Notifier({"NOTIFY_SOCKET": path}), 1.0, healthy=lambda: health["ok"])

    await watchdog.step()
    await watchdog.step()
    health["ok"] = True
    await watchdog.step()

    assert watchdog.pings == 1
    sock.setblocking(False)
    assert sock.recv(64) == b"WATCHDOG=1"
    with pytest.raises(BlockingIOError):
        sock.recv(64)
