"""The one SIGTERM/SIGINT rule of the three binaries: the first stops gracefully, a second stops
at once. Real signals, sent to this process (handlers checked installed first) or to a child."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kubeclient.signals import StopSignals

ROOT = Path(__file__).resolve().parents[2]


def send(sig: signal.Signals) -> None:
    """Signal this process; only with our handler in place (the default would end pytest)."""
    assert signal.getsignal(sig) not in (signal.SIG_DFL, signal.default_int_handler)
    os.kill(os.getpid(), sig)


async def test_the_first_signal_asks_for_a_stop_and_a_second_exits_at_once() -> None:
    exits: list[int] = []
    with StopSignals(exit_now=exits.append) as signals:
        send(signal.SIGTERM)
        await asyncio.wait_for(signals.stop.wait(), 5)
        assert exits == []
        send(signal.SIGINT)
        async with asyncio.timeout(5):
            while not exits:  # noqa: ASYNC110 - the handler runs on a later loop iteration
                await asyncio.sleep(0.01)
    assert exits == [128 + signal.SIGINT]
    assert signals.received == [signal.SIGTERM, signal.SIGINT]


async def test_other_signals_go_to_their_own_handler_and_do_not_stop() -> None:
    hups: list[int] = []
    with StopSignals(also={signal.SIGHUP: lambda: hups.append(1)}) as signals:
        send(signal.SIGHUP)
        async with asyncio.timeout(5):
            while not hups:  # noqa: ASYNC110 - the handler runs on a later loop iteration
                await asyncio.sleep(0.01)
        assert not signals.stop.is_set()


async def test_the_handlers_are_removed_after_the_block() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with StopSignals():
        assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_outside_the_main_thread_it_warns_and_the_stop_event_still_works(
    caplog: pytest.LogCaptureFixture,
) -> None:
    result: list[bool] = []

    async def body() -> None:
        with StopSignals() as signals:
            signals.stop.set()  # what a caller does where no signal can arrive
            result.append(signals.stop.is_set())

    thread = threading.Thread(target=lambda: asyncio.run(body()), name="not-main")
    thread.start()
    thread.join(10)
    assert result == [True]
    assert "cannot handle SIGTERM here" in caplog.text


CHILD = """
import asyncio, logging, sys
from kubeclient.signals import StopSignals
logging.basicConfig(level=logging.INFO, stream=sys.stderr)

async def main() -> int:
    with StopSignals() as signals:
        print("ready", flush=True)
        await signals.stop.wait()
        print("stopping", flush=True)
        await asyncio.Event().wait()  # a stop that never finishes
    return 0

sys.exit(asyncio.run(main()))
"""


@pytest.mark.parametrize(
    ("first", "second"),
    [(signal.SIGTERM, signal.SIGTERM), (signal.SIGTERM, signal.SIGINT)],
    ids=["term-term", "term-int"],
)
def test_a_process_whose_stop_hangs_exits_at_the_second_signal(
    first: signal.Signals, second: signal.Signals
) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "ready\n"
            proc.send_signal(first)
            assert proc.stdout.readline() == "stopping\n"
            proc.send_signal(second)
            assert proc.wait(timeout=10) == 128 + second
            assert proc.stderr is not None
            assert f"{second.name} again: exiting now" in proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
