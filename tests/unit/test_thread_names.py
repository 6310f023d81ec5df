"""The koordlet's threads carry their names in the kernel (``/proc/<pid>/task/<tid>/comm``), as
``top -H``, ``ps -L`` and ``perf`` show them: read back from the real ``/proc``."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from koordlet.executor import CgroupWriter
from koordlet.executor.audit import AuditLog
from koordlet.system.libc import THREAD_NAME_MAX, name_os_thread
from tests.fakehost import FakeHost

if not Path(f"/proc/{os.getpid()}/task").is_dir():  # pragma: no cover - Linux only
    pytest.skip("no /proc/<pid>/task here", allow_module_level=True)


def _comm(tid: int) -> str:
    return Path(f"/proc/{os.getpid()}/task/{tid}/comm").read_text().rstrip("\n")


def _in_thread(name: str | None, python_name: str = "t") -> str:
    seen: dict[str, str] = {}

    def run() -> None:
        name_os_thread(name)
        seen["comm"] = _comm(threading.get_native_id())

    thread = threading.Thread(target=run, name=python_name)
    thread.start()
    thread.join()
    return seen["comm"]


def test_a_thread_is_named_in_the_kernel_by_its_python_name_or_the_one_given() -> None:
    assert _in_thread(None, python_name="collect_0") == "collect_0"
    assert _in_thread("audit-log") == "audit-log"


def test_the_kernel_keeps_the_first_fifteen_bytes() -> None:
    assert (
        _in_thread("a-name-longer-than-fifteen") == "a-name-longer-than-fifteen"[:THREAD_NAME_MAX]
    )


def test_an_executor_with_the_initializer_names_its_threads() -> None:
    with ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="collect", initializer=name_os_thread
    ) as pool:
        tid = pool.submit(threading.get_native_id).result()
        assert _comm(tid) == "collect_0"


def test_the_cgroup_writer_thread_is_named(fake_host: FakeHost) -> None:
    with CgroupWriter(fake_host.host) as writer:
        tid = writer.call(threading.get_native_id).result()
        assert _comm(tid) == "cgroup-writer_0"


def test_the_audit_log_thread_is_named(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path))
    before = set(threading.enumerate())  # other tests' audit logs may still run: not those
    log.start()
    try:
        [thread] = [t for t in set(threading.enumerate()) - before if t.name == "audit-log"]
        assert thread.native_id is not None
        deadline = time.monotonic() + 10  # named as its first step: wait for it, bounded
        while _comm(thread.native_id) != "audit-log" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _comm(thread.native_id) == "audit-log"
    finally:
        log.close()
