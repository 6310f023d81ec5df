"""``koordlet status``: what the running daemon on this machine is doing, in a terminal.

It asks the daemon's loopback ``/debug`` views (``/debug/summary``, ``/debug/qos``,
``/debug/capabilities``; docs/ui.md) and prints: the mode and whether it only decides (dry run),
node usage against capacity, the BE allowance against the suppress threshold, the pods of each
QoS class with their usage, the last action of every strategy (and why the others do not run),
and the capabilities this host lacks. ``--json`` prints the three answers as one JSON object.

A view the daemon's request limiter refuses (``503`` with ``Retry-After``: it is busy serving
other requests) is asked again after the pause it names, at most :data:`RETRIES` times and
:data:`MAX_RETRY_AFTER` seconds a pause.

Exit codes: 0 when the daemon answered; 2 when none answers at ``--addr`` (one line on stderr
saying where it looked), when it answers something that is not the koordlet's ``/debug``, or when
it stays busy through the retries.
"""

from __future__ import annotations

import argparse
import email.utils
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from koordlet.config import ServerConfig

EXIT_NO_DAEMON = 2
"""Exit code when no koordlet answers (as for a usage error: nothing was shown)."""
PATHS = ("/debug/summary", "/debug/qos", "/debug/capabilities")
"""The views the summary is made of."""
RETRIES = 3
"""Times a view refused with ``503`` and ``Retry-After`` is asked again."""
MAX_RETRY_AFTER = 5.0
"""Longest pause honoured for one ``Retry-After``, seconds (a longer one waits this long)."""


class NoDaemonError(Exception):
    """No koordlet answered at the address, or what answered is not one."""


def base_url(addr: str) -> str:
    """The loopback URL of a daemon listening on ``addr`` (``--addr``'s ``HOST:PORT``): an empty
    or wildcard host is reached on loopback, where ``/debug`` is served."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--addr must be HOST:PORT, got {addr!r}")
    host = host.strip("[]")
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def retry_after(value: str | None, now: float) -> float | None:
    """The pause a ``Retry-After`` header asks for (RFC 9110 section 10.2.3: delay-seconds or an
    HTTP-date), in seconds within ``[0, MAX_RETRY_AFTER]``; None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - now
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def fetch(
    base: str,
    path: str,
    timeout: float,
    *,
    sleep: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> Any:
    """GET ``base + path`` as JSON, asking again after a ``503`` with ``Retry-After`` (see the
    module docstring); :class:`NoDaemonError` saying what went wrong."""
    for attempt in range(RETRIES + 1):
        try:
            with urllib.request.urlopen(base + path, timeout=timeout) as resp:
                body = resp.read()
            break
        except urllib.error.HTTPError as err:
            detail = err.read().decode("utf-8", "replace").strip()[:200]
            pause = (
                retry_after(err.headers.get("Retry-After"), clock()) if err.code == 503 else None
            )
            if pause is None or attempt == RETRIES:
                tries = f" (asked {attempt + 1} times)" if attempt else ""
                raise NoDaemonError(f"{base}{path} answered {err.code}{tries}: {detail}") from err
            sleep(pause)
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise NoDaemonError(f"no koordlet answers at {base} ({reason})") from err
    try:
        return json.loads(body)
    except ValueError as err:
        raise NoDaemonError(f"{base}{path} did not answer JSON: is this a koordlet?") from err


def collect(
    base: str, timeout: float, *, sleep: Callable[[float], object] = time.sleep
) -> dict[str, Any]:
    """The answers of :data:`PATHS`, by path."""
    return {path: fetch(base, path, timeout, sleep=sleep) for path in PATHS}


# Formatting ----------------------------------------------------------------------------------


def _cores(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _bytes(v: float | None) -> str:
    if v is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(v) < 1024:
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} TiB"


def _share(used: float | None, total: float | None) -> str:
    if used is None or not total:
        return ""
    return f" ({100 * used / total:.0f}%)"


def _ago(ts: object, now: float) -> str:
    if not isinstance(ts, int | float):
        return "-"
    s = max(0.0, now - ts)
    if s < 60:
        return f"{s:.0f}s ago"
    return f"{s / 60:.0f}m ago" if s < 3600 else f"{s / 3600:.1f}h ago"


def _one_line(text: object, width: int) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def render(answers: Mapping[str, Any], base: str, out: TextIO, now: float) -> None:
    """The terminal summary of the module docstring, from the answers of :data:`PATHS`."""
    summary, qos, caps = (answers[p] for p in PATHS)
    w = out.write
    dry = summary["dry_run"]
    mode = "dry run: decides and logs, changes nothing" if dry["all"] else "acting"
    if not dry["all"] and dry["strategies"]:
        mode = f"acting; dry run for {', '.join(dry['strategies'])}"
    w(f"koordlet on {summary['node']} ({base}): {summary['mode']} mode, {mode}\n\n")

    cap, use, th, be = summary["capacity"], summary["usage"], summary["thresholds"], summary["be"]
    cpu, mem = use["node_cpu_cores"], use["node_memory_bytes"]
    w(
        f"node        CPU {_cores(cpu)} of {cap['cpu_cores'] or '?'} cores"
        f"{_share(cpu, cap['cpu_cores'])}, memory {_bytes(mem)} of "
        f"{_bytes(cap['memory_bytes'])}{_share(mem, cap['memory_bytes'])}\n"
    )
    state = "on" if th["enable"] else "off (resourceUsedThresholdWithBE.enable is false)"
    w(
        f"BE          allowance {_cores(be['cpu_allowance_cores'])} cores, uses "
        f"{_cores(be['cpu_used_cores'])}, requests {_cores(be['cpu_request_cores'])}\n"
    )
    w(
        f"thresholds  suppress BE at {th['cpu_suppress_threshold_percent']}% CPU "
        f"({_cores(th['cpu_suppress_threshold_cores'])} cores, {th['cpu_suppress_policy']}), "
        f"evict BE at {th['memory_evict_threshold_percent']}% memory "
        f"({_bytes(th['memory_evict_threshold_bytes'])}); {state}\n"
    )
    if th.get("nodeslo_rejected"):
        w(f"            NodeSLO rejected, last good values kept: {th['nodeslo_rejected']}\n")
    for line in summary.get("degraded") or ():
        w(f"state dir   {_one_line(line, 200)}\n")

    w(f"\n{'class':<12}{'pods':>5}{'CPU cores':>12}{'memory':>12}\n")
    for name, row in summary["classes"].items():
        note = f"  ({row['unmeasured']} not measured yet)" if row.get("unmeasured") else ""
        w(
            f"{name:<12}{row['pods']:>5}{_cores(row['cpu_cores']):>12}"
            f"{_bytes(row['memory_bytes']):>12}{note}\n"
        )
    w(
        f"{'system':<12}{'':>5}{_cores(use['system_cpu_cores']):>12}"
        f"{_bytes(use['system_memory_bytes']):>12}\n"
    )
    if not summary["classes"]:
        w("(no pods found)\n")

    w(f"\n{'strategy':<14}{'last action':<58}{'when':>9}{'rounds':>8}{'errors':>8}\n")
    for name, st in sorted(qos.get("strategies", {}).items()):
        last = st.get("last_round") or {}
        action = last.get("decision") or "no round yet"
        if last.get("result"):
            action += f": {last['result']}"
        tags = [t for t, on in (("dry run", st.get("dry_run")), ("stale", last.get("stale"))) if on]
        if tags:
            action = f"[{', '.join(tags)}] {action}"
        w(
            f"{name:<14}{_one_line(action, 56):<58}{_ago(last.get('at'), now):>9}"
            f"{st.get('rounds', 0):>8}{st.get('errors', 0):>8}\n"
        )
        if st.get("errors") and st.get("last_error"):
            w(f"{'':<14}last error: {_one_line(st['last_error'], 80)}\n")
    for name, why in sorted(qos.get("disabled", {}).items()):
        w(f"{name:<14}not running: {why}\n")

    missing = {n: c for n, c in caps.items() if isinstance(c, dict) and not c.get("supported")}
    w(f"\ncapabilities missing: {len(missing)} of {len(caps)}\n")
    for name, c in sorted(missing.items()):
        w(f"  {name}: {_one_line(c.get('reason') or 'unsupported', 100)}\n")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="koordlet status",
        description="Summarize the koordlet running on this machine, from its /debug views.",
    )
    parser.add_argument(
        "--addr",
        default=ServerConfig().addr,
        help="the daemon's --addr (default %(default)s); a wildcard host is asked on loopback",
    )
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for each answer (5)"
    )
    parser.add_argument("--json", action="store_true", help="the raw answers as one JSON object")
    return parser


def main(
    argv: Sequence[str],
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], object] = time.sleep,
) -> int:
    """Run ``koordlet status`` with the words after ``status``; returns the exit code
    (``sleep``: how to wait before asking a busy daemon again)."""
    out = out or sys.stdout
    err = err or sys.stderr
    args = _parser().parse_args(argv)
    try:
        base = base_url(args.addr)
        answers = collect(base, args.timeout, sleep=sleep)
    except (ValueError, NoDaemonError) as error:
        print(f"koordlet status: {error}", file=err)
        return EXIT_NO_DAEMON
    if args.json:
        json.dump(answers, out, indent=2, sort_keys=True)
        out.write("\n")
        return 0
    try:
        render(answers, base, out, clock())
    except (KeyError, TypeError, AttributeError) as error:
        print(f"koordlet status: {base} answered an unexpected /debug shape ({error!r})", file=err)
        return EXIT_NO_DAEMON
    return 0
