"""``koordlet reset [--dry-run] [FLAGS]``: put back what this koordlet wrote to the host.

The koordlet keeps what it wrote when it stops (best-effort pods stay throttled and LS pods stay
protected across a restart or an upgrade). ``reset`` is for leaving the node: it puts back the
best-effort QoS cgroup's CFS quota and cpuset (unlimited, all of the parent's), the QoS knobs it
set (the kernel's defaults), the sysctls (the values found before its first write), its
resctrl groups, its network QoS tree and the files it wrote for Terway's terway-qos, from the
originals journal in ``<state-dir>/originals.jsonl``
(:mod:`koordlet.executor.restore` has the table). Every write goes through the same writers as
the daemon's, so it is validated and recorded in the audit log (strategy ``reset``).

It takes the daemon's flags (``--config``, ``--state-dir``, ``--cgroup-root-dir``...) to find
the same host and state. ``--dry-run`` prints what it would write and writes nothing. A koordlet
still answering on ``--addr`` would write its values again at once: ``reset`` refuses then,
unless ``--force``. The deb and rpm removal run it after stopping the service; for the DaemonSet,
docs/kubernetes.md shows the Job.

Exit codes: 0 when everything was put back (or there was nothing), 1 when a step failed (each is
printed), 2 for a bad flag or path (one line) or a koordlet still running.
"""

from __future__ import annotations

import argparse
import logging
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import TextIO

from apis.gobool import parse_go_bool
from koordlet.config import KoordletConfig, load_config
from koordlet.errors import ConfigError
from koordlet.executor.audit import audit_log_for
from koordlet.executor.originals import OriginalsJournal, read_boot_id
from koordlet.executor.restore import Outcome, apply, plan
from koordlet.executor.sysctl import SystemFileWriter
from koordlet.executor.writer import CgroupWriter
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from koordlet.system.host import Host
from kubeclient.flags import SuggestingParser

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
USAGE = "koordlet reset [--dry-run] [--force] [KOORDLET FLAGS]"


def _parser() -> argparse.ArgumentParser:
    p = SuggestingParser(
        prog="koordlet reset",
        usage=USAGE,
        description="Put back what this koordlet wrote: the BE QoS cgroup's CFS quota and "
        "cpuset, QoS knobs, sysctls, resctrl groups, the network QoS tree and terway-qos's "
        "files (docs/baremetal.md).",
        epilog="Every other flag is the koordlet's (koordlet --help): pass the same --config, "
        "--state-dir and --cgroup-root-dir as the daemon.",
    )
    p.add_argument(
        "--dry-run",
        nargs="?",
        const="true",
        default="false",
        metavar="BOOL",
        help="print what would be written; write nothing (default: false)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="reset even though a koordlet answers on --addr (it would write again)",
    )
    return p


def _running(cfg: KoordletConfig) -> str:
    """The URL of a koordlet answering ``/healthz`` on ``--addr``, empty when none does."""
    host = cfg.server.host
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    url = f"http://{host if ':' not in host else f'[{host}]'}:{cfg.server.port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=1.0):
            return url
    except urllib.error.HTTPError:
        return url  # something koordlet-like answered
    except (OSError, ValueError):
        return ""


def _check_not_running(cfg: KoordletConfig) -> None:
    running = _running(cfg)
    if running:
        raise ConfigError(
            f"a koordlet answers at {running}; stop it first (systemctl stop koordlet, or "
            "delete the DaemonSet) or it writes its values again; --force resets anyway",
            source="--addr",
        )


def _line(outcome: Outcome) -> str:
    s = outcome.step
    what = f"{s.path} ({s.knob})"
    if outcome.error:
        return f"failed   {what}: {outcome.error}"
    if outcome.skipped:
        return f"skipped  {what}: {outcome.skipped}"
    r = outcome.result
    if r is None:
        return f"skipped  {what}"
    if r.dry_run:
        return f"would    {what}: {r.old!r} -> {r.new.strip()!r}"
    if r.changed:
        return f"wrote    {what}: {r.old!r} -> {r.new.strip()!r}"
    return f"ok       {what}: already {r.old!r}"


def reset(cfg: KoordletConfig, *, dry_run: bool, out: TextIO | None = None) -> int:
    """Put back (or, ``dry_run``, show) what the koordlet of ``cfg`` wrote; the exit code."""
    c = cfg.cgroup
    host = Host.detect_configured(
        cfg.paths,
        version=None if c.version == "auto" else CgroupVersion(c.version),
        driver=None if c.driver == "auto" else CgroupDriver(c.driver),
        kube_path=c.kube_path,
    )
    journal = OriginalsJournal(cfg.state_dir, boot_id=read_boot_id(cfg.paths.proc_root)).load()
    steps = plan(host, journal.entries())
    audit = audit_log_for(cfg)
    audit.start()
    try:
        writer = CgroupWriter(host, on_change=audit.on_write, dry_run_all=dry_run)
        sysfiles = SystemFileWriter(
            cfg.paths, on_change=audit.on_write, is_dry_run=lambda _strategy: dry_run
        )
        outcomes = apply(steps, host=host, writer=writer, sysfiles=sysfiles, journal=journal)
    finally:
        audit.close(2.0)
    out = out or sys.stdout
    for outcome in outcomes:
        print(_line(outcome), file=out)
    failed = sum(1 for o in outcomes if o.error)
    changed = sum(
        1 for o in outcomes if o.result is not None and (o.result.changed or o.result.dry_run)
    )
    verb = "would write" if dry_run else "wrote"
    print(
        f"koordlet reset: {verb} {changed} of {len(outcomes)} values "
        f"({len(journal)} left in {journal.path}); {failed} failed"
        + (f"; audited in {audit.path}" if not dry_run else ""),
        file=out,
    )
    return EXIT_FAILED if failed else EXIT_OK


def main(argv: Sequence[str]) -> int:
    """``koordlet reset``'s entry: its own flags, then the koordlet's."""
    try:
        args, rest = _parser().parse_known_args(list(argv))
    except SystemExit as done:  # --help or a usage error (argparse printed it)
        return done.code if isinstance(done.code, int) else EXIT_OK
    try:
        dry_run = parse_go_bool(args.dry_run)
    except ValueError:
        print(
            f"koordlet reset: --dry-run: must be true or false, got {args.dry_run!r}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    logging.basicConfig(level=logging.WARNING, format="koordlet reset: %(message)s")
    try:
        cfg = load_config(rest)
        if not args.force:
            _check_not_running(cfg)
        return reset(cfg, dry_run=dry_run)
    except ConfigError as err:
        print(f"koordlet: {err}", file=sys.stderr)
        return EXIT_USAGE
