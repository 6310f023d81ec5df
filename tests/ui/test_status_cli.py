"""``koordlet status`` against a real daemon started by the test, and with none listening."""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet import cli, status
from koordlet.status import EXIT_NO_DAEMON, base_url
from tests.daemon import free_port
from tests.ui.demo import SCRIPT, DemoNode, koordlet, write_nodeslo

pytestmark = pytest.mark.daemon

CPUS = 4


def run_status(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = status.main(list(args), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_status_summarizes_mode_usage_classes_strategies_and_missing_capabilities(
    host_root: Path, tmp_path: Path
) -> None:
    node = DemoNode(host_root, pods=8, ncpus=CPUS)
    slo = write_nodeslo(
        tmp_path / "nodeslo.yaml", {"enable": True, "cpuSuppressThresholdPercent": 50}
    )
    args = node.args(
        "--dry-run", "--nodeslo-file", str(slo), "--collect-res-used-interval-seconds", "100ms"
    )
    with koordlet(args, tmp_path) as daemon:

        def measured() -> bool:
            node.advance(0.1)
            summary = daemon.json("/debug/summary")
            qos = daemon.json("/debug/qos")["strategies"]
            rows = summary["classes"].values()
            return (
                summary["usage"]["node_cpu_cores"] is not None
                and summary["capacity"]["cpu_cores"] == CPUS
                and all(r["unmeasured"] == 0 for r in rows)
                and qos["cpusuppress"]["last_round"] is not None
            )

        daemon.until("every pod measured and a suppress round", measured)
        summary = daemon.json("/debug/summary")
        qos = daemon.json("/debug/qos")
        caps = daemon.json("/debug/capabilities")
        # The console script, as an operator runs it.
        done = subprocess.run(
            [str(SCRIPT), "status", "--addr", daemon.addr],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        as_json = subprocess.run(
            [str(SCRIPT), "status", "--addr", daemon.addr, "--json"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    assert done.returncode == 0, done.stderr
    text = done.stdout
    first = text.splitlines()[0]
    assert first.startswith(f"koordlet on demo-node (http://{daemon.addr}): standalone mode,")
    assert "dry run: decides and logs, changes nothing" in first
    assert re.search(rf"^node +CPU [0-9.]+ of {CPUS} cores \(\d+%\), memory ", text, re.M)
    # 50 % of 4 CPUs, from the NodeSLO file; policy and memory threshold from the defaults.
    assert re.search(r"suppress BE at 50% CPU \(2\.00 cores, cpuset\)", text), text
    assert "evict BE at 70% memory" in text
    # Pods by class: the classes and counts the daemon reports, each on its own row.
    for name, row in summary["classes"].items():
        assert re.search(rf"^{name} +{row['pods']} +[0-9.]+ +[0-9.]+ \w+$", text, re.M), name
    assert {"LSR", "LS", "BE"} <= set(summary["classes"])
    # Every running strategy's last action, marked as a dry run; every disabled one with why.
    for name, st in qos["strategies"].items():
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{name} "))
        assert "[dry run" in line
        assert st["last_round"] is None or st["last_round"]["decision"][:20] in line
    for name, why in qos["disabled"].items():
        assert f"{name:<14}not running: {why}" in text
    # Capabilities this fake host lacks, with the probe's reason.
    missing = sorted(n for n, c in caps.items() if not c["supported"])
    assert f"capabilities missing: {len(missing)} of {len(caps)}" in text
    for name in missing:
        assert f"  {name}: " in text

    assert as_json.returncode == 0, as_json.stderr
    raw = json.loads(as_json.stdout)
    assert set(raw) == {"/debug/summary", "/debug/qos", "/debug/capabilities"}
    assert raw["/debug/summary"]["node"] == "demo-node"


def test_no_daemon_is_one_line_on_stderr_and_exit_2() -> None:
    addr = f"127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    code, out, err = run_status("--addr", addr, "--timeout", "2")
    assert code == EXIT_NO_DAEMON == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"koordlet status: no koordlet answers at http://{addr} (")
    assert time.monotonic() - started < 10


def test_the_koordlet_command_dispatches_status() -> None:
    addr = f"127.0.0.1:{free_port()}"
    assert cli.main(["status", "--addr", addr, "--timeout", "1"]) == EXIT_NO_DAEMON


def test_something_else_answering_is_not_taken_for_a_koordlet(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "debug").mkdir()
    (tmp_path / "debug" / "summary").write_text("<html>hello</html>")
    server = subprocess.Popen(
        ["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            code, _, err = run_status("--addr", f"127.0.0.1:{port}", "--timeout", "2")
            if "did not answer JSON" in err or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        server.kill()
        server.wait(timeout=10)
    assert code == EXIT_NO_DAEMON
    url = f"http://127.0.0.1:{port}/debug/summary"
    assert err == f"koordlet status: {url} did not answer JSON: is this a koordlet?\n"


@pytest.mark.parametrize(
    ("addr", "url"),
    [
        ("127.0.0.1:9316", "http://127.0.0.1:9316"),
        (":9316", "http://127.0.0.1:9316"),
        ("0.0.0.0:9316", "http://127.0.0.1:9316"),
        ("[::]:9316", "http://[::1]:9316"),
        ("[::1]:19316", "http://[::1]:19316"),
    ],
)
def test_a_wildcard_listen_address_is_asked_on_loopback(addr: str, url: str) -> None:
    assert base_url(addr) == url


def test_a_malformed_addr_is_a_one_line_error() -> None:
    code, _, err = run_status("--addr", "localhost")
    assert code == EXIT_NO_DAEMON
    assert err == "koordlet status: --addr must be HOST:PORT, got 'localhost'\n"


class _Busy(http.server.BaseHTTPRequestHandler):
    """Answers 503 with the server's ``retry_after`` header the first ``refusals`` times, then
    ``{}`` as JSON, as the koordlet's request limiter and /debug views do."""

    server: _BusyServer

    def do_GET(self) -> None:
        self.server.asked.append(self.path)
        if self.server.refusals > 0:
            self.server.refusals -= 1
            body = b"busy: too many requests in flight; retry later\n"
            self.send_response(503)
            if self.server.retry_after is not None:
                self.send_header("Retry-After", self.server.retry_after)
        else:
            body = b"{}"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _BusyServer(http.server.ThreadingHTTPServer):
    def __init__(self, refusals: int, retry_after: str | None) -> None:
        super().__init__(("127.0.0.1", 0), _Busy)
        self.refusals = refusals
        self.retry_after = retry_after
        self.asked: list[str] = []


@contextlib.contextmanager
def busy_daemon(refusals: int, retry_after: str | None = "1") -> Iterator[_BusyServer]:
    server = _BusyServer(refusals, retry_after)
    thread = threading.Thread(target=server.serve_forever, name="busy-daemon", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def run_status_sleeping(*args: str) -> tuple[int, str, str, list[float]]:
    slept: list[float] = []
    out, err = io.StringIO(), io.StringIO()
    code = status.main(list(args), out=out, err=err, sleep=slept.append)
    return code, out.getvalue(), err.getvalue(), slept


def test_a_busy_daemon_is_asked_again_after_its_retry_after() -> None:
    with busy_daemon(refusals=2, retry_after="2") as server:
        addr = f"127.0.0.1:{server.server_address[1]}"
        code, out, err, slept = run_status_sleeping("--addr", addr, "--json")
    assert (code, err) == (0, "")
    assert set(json.loads(out)) == set(status.PATHS)
    assert slept == [2.0, 2.0]
    assert server.asked == ["/debug/summary"] * 3 + ["/debug/qos", "/debug/capabilities"]


def test_a_daemon_busy_through_the_retries_is_one_line_and_exit_2() -> None:
    with busy_daemon(refusals=100, retry_after="3600") as server:
        addr = f"127.0.0.1:{server.server_address[1]}"
        code, out, err, slept = run_status_sleeping("--addr", addr)
    assert (code, out) == (EXIT_NO_DAEMON, "")
    assert slept == [status.MAX_RETRY_AFTER] * status.RETRIES  # an hour asked, 5 s honoured
    assert err == (
        f"koordlet status: http://{addr}/debug/summary answered 503 (asked 4 times): "
        "busy: too many requests in flight; retry later\n"
    )


def test_a_503_without_retry_after_is_not_retried() -> None:
    with busy_daemon(refusals=1, retry_after=None) as server:
        addr = f"127.0.0.1:{server.server_address[1]}"
        code, _, err, slept = run_status_sleeping("--addr", addr)
    assert (code, slept) == (EXIT_NO_DAEMON, [])
    assert "answered 503: busy" in err


@pytest.mark.parametrize(
    ("header", "pause"),
    [
        ("1", 1.0),
        (" 0 ", 0.0),
        ("120", status.MAX_RETRY_AFTER),
        ("Wed, 21 Oct 2015 07:28:02 GMT", 2.0),  # an HTTP-date, 2 s after "now"
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),  # in the past
        ("-1", None),
        ("soon", None),
        ("", None),
    ],
)
def test_retry_after_reads_seconds_or_an_http_date_within_bounds(
    header: str, pause: float | None
) -> None:
    now = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    assert status.retry_after(header, now) == pause
