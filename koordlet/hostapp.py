"""``koordlet host-app``: start a host application inside its reserved cgroup, list declared ones.

A host application is declared in the NodeSLO (``spec.hostApplications``); the koordlet finds
its cgroup the way Koordinator does (``koordlet.statesinformer.hostapps``): by default
``host-latency-sensitive/<name>`` for LSE/LSR/LS and ``host-best-effort/<name>`` for BE, under
the root of every hierarchy, whatever the cgroup driver. This module makes that cgroup exist and
puts a process in it::

    koordlet host-app run  --name NAME [--nodeslo-file F] [--config F] -- COMMAND [ARG...]
    koordlet host-app list [--nodeslo-file F] [--config F] [--json]

``run`` looks the name up in the local NodeSLO file, creates the cgroup (on v1 a directory under
each mounted controller of :data:`V1_CONTROLLERS`, on v2 one directory in the unified tree),
writes its own PID to each ``cgroup.procs`` and then ``exec``\\ s the command, which therefore
keeps the launcher's PID, environment and file descriptors. Only levels that did not exist are
initialised: on v1 a new ``cpuset`` level gets its parent's ``cpuset.cpus`` and
``cpuset.mems`` (a task cannot join an empty cpuset); on v2 a new inner level gets
``cgroup.subtree_control`` enabled for the controllers it has, so the leaf gets them too. Nothing
else is written: the QoS settings (CPU QoS, the LS share-pool cpuset, BE suppression) are the
running koordlet's to apply through its executor. The cgroup stays when the application ends
(empty and reusable; ``rmdir`` it to remove).

A cgroup whose new levels would carry systemd unit names (``.slice``, ``.scope``, ``.service``)
is refused: those belong to systemd, and an application placed by a ``Slice=`` drop-in or
``systemd-run`` gets them from systemd itself (``docs/baremetal.md``).

``list`` prints each declared application with its cgroup, whether it exists and how many
processes it holds; an application declared but absent is reported, not an error.

Exit codes: 2 for a bad flag, NodeSLO or unknown name (``koordlet: <file>: <field>: <reason>``);
1 when the host refuses (the cgroup cannot be made or joined, the command cannot be executed).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence

from apis.records import frozen
from apis.slo import HostApplication
from apis.slo_inforce import NodeSLOInForce
from koordlet.config import DEFAULT_NODESLO_FILE, load_config, load_node_slo
from koordlet.errors import ConfigError, HostError, KoordletError
from koordlet.statesinformer.hostapps import cgroup_present, host_app_cgroup_dir
from koordlet.system.cgroups import CgroupDriver, CgroupLayout, CgroupVersion
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths
from kubeclient.flags import SuggestingParser

logger = logging.getLogger(__name__)

EXIT_HOST = 1
"""The host refused: the cgroup could not be made or joined, or the command not executed."""
EXIT_CONFIG = 2
"""Bad flags, NodeSLO file or application name."""

V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "blkio", "pids")
"""v1 controllers a host application's cgroup is made in (those mounted): what the koordlet
collects from (cpuacct, memory) and tunes (cpu, cpuset, memory, blkio), plus pids."""
SYSTEMD_UNIT_SUFFIXES = (".slice", ".scope", ".service")
"""Directory names systemd owns; the launcher never creates them."""

Exec = Callable[[str, list[str]], object]
"""``os.execvp``'s shape; tests pass one that returns."""


def _execvp(file: str, args: list[str]) -> object:
    os.execvp(file, args)


@frozen
class Placement:
    """Where one host application's processes go."""

    app: HostApplication
    """The declared application."""
    rel: str
    """Its cgroup, relative to each controller root (v1) or the unified root (v2)."""
    roots: tuple[str, ...]
    """Controller roots it is made under: each mounted v1 controller of :data:`V1_CONTROLLERS`
    once (``cpu`` and ``cpuacct`` are often the same hierarchy), or the unified root."""
    version: CgroupVersion
    """The host's cgroup version."""

    @property
    def dirs(self) -> tuple[str, ...]:
        """The cgroup's absolute directory in each hierarchy."""
        return tuple(os.path.join(root, self.rel) for root in self.roots)


def find_app(spec: NodeSLOInForce, name: str, source: str) -> HostApplication:
    """The application called ``name``; ConfigError listing the declared ones otherwise."""
    for app in spec.host_applications:
        if app.name == name:
            return app
    declared = ", ".join(a.name for a in spec.host_applications) or "none"
    raise ConfigError(
        f"no host application {name!r} is declared (declared: {declared})",
        source=source,
        field="spec.hostApplications",
    )


def _controller_roots(layout: CgroupLayout) -> tuple[str, ...]:
    if layout.version is CgroupVersion.V2:
        return (layout.paths.cgroup_root,)
    roots: dict[str, str] = {}
    for controller in V1_CONTROLLERS:
        root = layout.abs_dir(controller, "")
        if os.path.isdir(root):
            roots.setdefault(os.path.realpath(root), root)
    if not roots:
        raise HostError(f"no v1 controller of {', '.join(V1_CONTROLLERS)} under {layout.paths}")
    return tuple(roots.values())


def place(app: HostApplication, layout: CgroupLayout) -> Placement:
    """Where ``app`` goes on a host laid out as ``layout`` (nothing is read but the mounts)."""
    rel = host_app_cgroup_dir(app, layout)
    return Placement(app, rel, _controller_roots(layout), layout.version)


def _missing_levels(root: str, rel: str) -> list[str]:
    """Relative paths of the levels of ``rel`` that do not exist under ``root``, outermost
    first."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return [p for p in prefixes if not os.path.isdir(os.path.join(root, p))]


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _init_v1_cpuset(root: str, level: str) -> None:
    """A new v1 cpuset level starts empty; give it its parent's CPUs and memory nodes."""
    parent = os.path.join(root, os.path.dirname(level))
    here = os.path.join(root, level)
    for name in ("cpuset.mems", "cpuset.cpus"):
        if not _read(os.path.join(here, name)):
            _write(os.path.join(here, name), _read(os.path.join(parent, name)))


def _enable_v2_controllers(root: str, level: str) -> None:
    """Let a new v2 inner level pass its controllers down to its children."""
    here = os.path.join(root, level)
    for controller in _read(os.path.join(here, "cgroup.controllers")).split():
        try:
            _write(os.path.join(here, "cgroup.subtree_control"), f"+{controller}")
        except OSError as err:
            logger.warning("cannot enable %s below %s: %s", controller, here, err.strerror)


def _check_not_systemds(placement: Placement, levels: Sequence[str]) -> None:
    leaf = placement.rel.rsplit("/", 1)[-1]
    owned = [lv for lv in (*levels, leaf) if lv.endswith(SYSTEMD_UNIT_SUFFIXES)]
    if owned:
        raise ConfigError(
            f"cgroup {placement.rel!r} is named as systemd names its units ({owned[0]!r}); "
            "systemd creates and owns those: start the application through systemd (a Slice= "
            "drop-in or systemd-run --slice=...), see docs/baremetal.md",
            field=f"hostApplications[{placement.app.name}].cgroupPath",
        )


def prepare(placement: Placement) -> list[str]:
    """Create the cgroup where missing, initialising only what was created; returns the created
    directories. Raises HostError (ConfigError for systemd-owned names)."""
    missing = {root: _missing_levels(root, placement.rel) for root in placement.roots}
    _check_not_systemds(placement, [lv.rsplit("/", 1)[-1] for ms in missing.values() for lv in ms])
    created: list[str] = []
    for root, levels in missing.items():
        is_cpuset = os.path.basename(os.path.realpath(root)).split(",").count("cpuset") > 0
        for level in levels:
            path = os.path.join(root, level)
            try:
                os.mkdir(path)
                created.append(path)
                if placement.version is CgroupVersion.V1 and is_cpuset:
                    _init_v1_cpuset(root, level)
                elif placement.version is CgroupVersion.V2 and level != placement.rel:
                    _enable_v2_controllers(root, level)
            except FileExistsError:
                continue  # made meanwhile by another launcher: theirs to initialise
            except OSError as err:
                raise HostError(f"cannot create cgroup {path}: {err.strerror}") from err
    if created:
        logger.info("created cgroup %s for host application %s", placement.rel, placement.app.name)
    return created


def join(placement: Placement, pid: int) -> None:
    """Move process ``pid`` (its whole thread group) into the cgroup in every hierarchy."""
    for d in placement.dirs:
        procs = os.path.join(d, "cgroup.procs")
        try:
            _write(procs, str(pid))
        except OSError as err:
            raise HostError(f"cannot move pid {pid} into {procs}: {err.strerror}") from err


def process_count(placement: Placement) -> int | None:
    """Processes in the cgroup (first hierarchy); None when it does not exist."""
    try:
        with open(os.path.join(placement.dirs[0], "cgroup.procs")) as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return None


# Command line --------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    common = SuggestingParser(add_help=False)
    common.add_argument(
        "--config",
        help="koordlet configuration file to take paths, cgroup settings and the NodeSLO file from",
    )
    common.add_argument(
        "--nodeslo-file", help=f"local NodeSLO declaring the applications ({DEFAULT_NODESLO_FILE})"
    )
    common.add_argument("--cgroup-root-dir", help="cgroup mount root (/sys/fs/cgroup)")
    common.add_argument("--cgroup-version", choices=("auto", "v1", "v2"))
    common.add_argument("--cgroup-driver", choices=("auto", "systemd", "cgroupfs"))
    common.add_argument("--cgroup-kube-dir", help="kubepods directory (kubepods/)")
    parser = SuggestingParser(
        prog="koordlet host-app", description="Host applications in their reserved cgroups."
    )
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser(
        "run", parents=[common], help="start COMMAND inside the application's cgroup"
    )
    run.add_argument("--name", required=True, help="the application's name in the NodeSLO")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    ls = sub.add_parser("list", parents=[common], help="declared applications and presence")
    ls.add_argument("--json", action="store_true", help="one JSON array instead of a table")
    return parser


def _host_and_spec(args: argparse.Namespace) -> tuple[Host, NodeSLOInForce, str]:
    flags = ["--config", args.config] if args.config else []
    for flag in ("cgroup_root_dir", "cgroup_version", "cgroup_driver", "cgroup_kube_dir"):
        value = getattr(args, flag)
        if value:
            flags += ["--" + flag.replace("_", "-"), value]
    cfg = load_config(flags)
    nodeslo = args.nodeslo_file or cfg.nodeslo_file or DEFAULT_NODESLO_FILE
    spec = load_node_slo(nodeslo)
    paths: HostPaths = cfg.paths
    host = Host.detect(
        paths,
        version=None if cfg.cgroup.version == "auto" else CgroupVersion(cfg.cgroup.version),
        driver=None if cfg.cgroup.driver == "auto" else CgroupDriver(cfg.cgroup.driver),
        kube_path=cfg.cgroup.kube_path,
    )
    return host, spec, nodeslo


def run_app(args: argparse.Namespace, exec_fn: Exec) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise ConfigError("a command is required after --", field="host-app run")
    host, spec, source = _host_and_spec(args)
    placement = place(find_app(spec, args.name, source), host.layout)
    prepare(placement)
    join(placement, os.getpid())
    logger.info("host application %s: exec %s in cgroup %s", args.name, command[0], placement.rel)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        exec_fn(command[0], command)
    except OSError as err:
        raise HostError(f"cannot execute {command[0]}: {err.strerror}") from err
    return 0  # only a test's exec_fn returns


def list_apps(args: argparse.Namespace) -> int:
    host, spec, source = _host_and_spec(args)
    rows = []
    for app in spec.host_applications:
        placement = place(app, host.layout)
        rows.append(
            {
                "name": app.name,
                "qos": app.qos.value,
                "priority": app.priority.value,
                "cgroup": placement.rel,
                "present": cgroup_present(host.layout, placement.rel),
                "processes": process_count(placement),
            }
        )
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print(f"no host applications declared in {source}")
        return 0
    header = ("NAME", "QOS", "PRIORITY", "CGROUP", "PRESENT", "PROCS")
    table = [header] + [
        (
            str(r["name"]),
            str(r["qos"]) or "-",
            str(r["priority"]) or "-",
            str(r["cgroup"]),
            "yes" if r["present"] else "no",
            "-" if r["processes"] is None else str(r["processes"]),
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def main(argv: Sequence[str], *, exec_fn: Exec = _execvp) -> int:
    """``koordlet host-app ARGS``; returns the exit code (``run`` does not return on success)."""
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as done:  # --help or a usage error (argparse printed it)
        return done.code if isinstance(done.code, int) else EXIT_CONFIG
    try:
        if args.action == "run":
            return run_app(args, exec_fn)
        return list_apps(args)
    except ConfigError as err:
        print(f"koordlet: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except KoordletError as err:
        print(f"koordlet: {err}", file=sys.stderr)
        return EXIT_HOST
