"""The one table of settings, :data:`SETTINGS`: each row's YAML key, flags, converter, help and
the Koordinator flag it mirrors. The command-line parser and ``--help`` are derived from it here;
the YAML schema and ``/debug/config`` in :mod:`koordlet.config.loading`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from apis.records import frozen
from koordlet import __version__
from koordlet.config.convert import (
    abs_path,
    addr,
    boolean,
    choice,
    cpu_share,
    disk_mb,
    duration_or_zero,
    evictions,
    factor,
    hook_stages,
    kube_dir,
    node_name,
    non_negative,
    nonempty,
    optional_abs_path,
    optional_file,
    optional_host,
    optional_path,
    optional_socket,
    percent,
    plugin_index,
    plugin_name,
    positive_duration,
    requests_in_flight,
    strategy_names,
    tcp_port,
)
from koordlet.config.model import DEFAULT_NODESLO_FILE, KoordletConfig
from koordlet.errors import ConfigError
from koordlet.features import FLAG as FEATURE_GATES_FLAG
from koordlet.features import help_lines
from kubeclient.flags import SuggestingParser, suggestion

VERSION_TEXT = f"koordlet (koordinator-py) {__version__}"
"""What ``--version`` prints."""


@frozen
class Setting:
    """One configuration setting: its YAML key, flags and where it lands in KoordletConfig."""

    key: str
    """YAML key path (``collect.resUsedInterval``); also the field name in error messages."""
    attr: str
    """Attribute path in :class:`KoordletConfig` (``collect.res_used_interval``)."""
    flags: tuple[str, ...]
    """Command-line flags; the first is the primary, the others aliases."""
    convert: Callable[[object], Any]
    """Checks and converts a YAML value or flag string; TypeError or ValueError say why not."""
    help: str
    """One line for ``--help``."""
    koordinator: str = ""
    """The Koordinator flag this mirrors; empty when the setting is koordinator-py's own."""
    is_bool: bool = False
    """A switch: ``--flag`` alone means true, ``--flag=false`` is accepted too."""


# fmt: off
SETTINGS: tuple[Setting, ...] = (
    Setting("nodeName", "node_name", ("--node-name",), node_name, "this node's name"),
    Setting("standalone", "standalone", ("--standalone",), boolean, "run without the API server",
            is_bool=True),
    Setting("nodesloFile", "nodeslo_file", ("--nodeslo-file",), optional_path,
            "local NodeSLO YAML/JSON for --standalone ('' for none)"),
    Setting("stateDir", "state_dir", ("--state-dir",), abs_path, "state kept across restarts"),
    Setting("logLevel", "log_level", ("--log-level",),
            choice("debug", "info", "warning", "error"), "debug, info, warning or error"),
    Setting("paths.cgroupRootDir", "paths.cgroup_root", ("--cgroup-root-dir",), abs_path,
            "cgroup mount root", "--cgroup-root-dir"),
    Setting("paths.procRootDir", "paths.proc_root", ("--proc-root-dir",), abs_path,
            "host /proc", "--proc-root-dir"),
    Setting("paths.sysRootDir", "paths.sys_root", ("--sys-root-dir",), abs_path, "host /sys",
            "--sys-root-dir"),
    Setting("paths.varLibKubeletDir", "paths.kubelet_root", ("--var-lib-kubelet-dir",),
            abs_path, "the kubelet's root directory (pod volumes)", "--var-lib-kubelet-dir"),
    Setting("cgroup.version", "cgroup.version", ("--cgroup-version",),
            choice("auto", "v1", "v2"), "auto, v1 or v2"),
    Setting("cgroup.driver", "cgroup.driver", ("--cgroup-driver",),
            choice("auto", "systemd", "cgroupfs"), "auto, systemd or cgroupfs"),
    Setting("cgroup.kubeDir", "cgroup.kube_path", ("--cgroup-kube-dir", "--cgroup-kube-path"),
            kube_dir, "kubepods directory below the roots", "--cgroup-kube-dir"),
    Setting("collect.resUsedInterval", "collect.res_used_interval",
            ("--collect-res-used-interval-seconds", "--collect-res-used-interval"),
            positive_duration, "resource usage collection interval",
            "--collect-res-used-interval-seconds"),
    Setting("collect.nodeCPUInfoInterval", "collect.node_cpu_info_interval",
            ("--collect-node-cpu-info-interval-seconds", "--collect-node-cpu-info-interval"),
            positive_duration, "node CPU info collection interval",
            "--collect-node-cpu-info-interval-seconds"),
    Setting("collect.nodeStorageInfoInterval", "collect.node_storage_info_interval",
            ("--collect-node-storage-info-interval",), positive_duration,
            "block devices and pod volumes collection interval",
            "--collect-node-storage-info-interval"),
    Setting("collect.psiInterval", "collect.psi_interval",
            ("--psi-collector-interval-seconds", "--psi-collector-interval"),
            positive_duration, "PSI collection interval", "--psi-collector-interval-seconds"),
    Setting("collect.cpiInterval", "collect.cpi_interval",
            ("--cpi-collector-interval", "--cpi-collector-interval-seconds"),
            positive_duration, "CPI collection interval", "--cpi-collector-interval"),
    Setting("collect.cpiTimeWindow", "collect.cpi_window",
            ("--collect-cpi-timewindow", "--collect-cpi-timewindow-seconds"),
            positive_duration, "CPI counting window", "--collect-cpi-timewindow"),
    Setting("collect.coldPageInterval", "collect.cold_page_interval",
            ("--coldpage-collector-interval",), positive_duration,
            "cold page collection interval", "--coldpage-collector-interval"),
    Setting("collect.coldPageAge", "collect.cold_page_age", ("--cold-page-age",),
            positive_duration, "seconds without access that make a page cold (DAMON source)"),
    Setting("collect.enableResctrlCollector", "collect.enable_resctrl_collector",
            ("--enable-resctrl-collector",), boolean, "collect resctrl LLC and bandwidth",
            "--enable-resctrl-collector", is_bool=True),
    Setting("collect.resctrlInterval", "collect.resctrl_interval",
            ("--resctrl-collector-interval",), positive_duration,
            "resctrl collection interval", "--resctrl-collector-interval"),
    Setting("server.addr", "server.addr", ("--addr",), addr, "HTTP listen address", "--addr"),
    Setting("server.debugAllowRemote", "server.debug_allow_remote", ("--debug-allow-remote",),
            boolean, "serve /debug/ to non-loopback clients", is_bool=True),
    Setting("server.maxRequestsInFlight", "server.max_requests_in_flight",
            ("--server-max-requests-in-flight",), requests_in_flight,
            "/metrics and /debug/ requests admitted at once"),
    Setting("server.cpuShare", "server.cpu_share", ("--server-cpu-share",), cpu_share,
            "fraction of one core /metrics and /debug/ requests may use"),
    Setting("qos.dryRun", "qos.dry_run", ("--dry-run",), boolean,
            "QoS strategies compute and audit but change nothing", is_bool=True),
    Setting("qos.dryRunStrategies", "qos.dry_run_strategies", ("--qos-dry-run-strategies",),
            strategy_names, "these QoS strategies (comma-separated) only compute and audit"),
    Setting("qos.reconcileInterval", "qos.reconcile_interval",
            ("--reconcile-interval-seconds",), positive_duration,
            "cgroup reconcile and CPU burst interval", "--reconcile-interval-seconds"),
    Setting("qos.cpuSuppressInterval", "qos.cpu_suppress_interval",
            ("--cpu-suppress-interval-seconds",), positive_duration, "CPU suppress interval",
            "--cpu-suppress-interval-seconds"),
    Setting("qos.cpuEvictInterval", "qos.cpu_evict_interval", ("--cpu-evict-interval-seconds",),
            positive_duration, "CPU eviction interval", "--cpu-evict-interval-seconds"),
    Setting("qos.memoryEvictInterval", "qos.memory_evict_interval",
            ("--memory-evict-interval-seconds",), positive_duration, "memory eviction interval",
            "--memory-evict-interval-seconds"),
    Setting("qos.memoryEvictCoolTime", "qos.memory_evict_cool_time",
            ("--memory-evict-cool-time-seconds",), positive_duration,
            "pause after a memory eviction", "--memory-evict-cool-time-seconds"),
    Setting("qos.cpuEvictCoolTime", "qos.cpu_evict_cool_time",
            ("--cpu-evict-cool-time-seconds",), positive_duration,
            "pause after a CPU eviction", "--cpu-evict-cool-time-seconds"),
    Setting("qos.evictMaxPerRound", "qos.evict_max_per_round", ("--qos-evict-max-per-round",),
            evictions, "evictions per strategy round at most (0: no cap)"),
    Setting("qos.evictDedupeWindow", "qos.evict_dedupe_window",
            ("--qos-evict-dedupe-window-seconds",), positive_duration,
            "seconds before a pod may be evicted again"),
    Setting("qos.memoryDistressPSIFullPercent", "qos.memory_distress_psi_full_on",
            ("--memory-distress-psi-full-percent",), percent,
            "evict BE pods at this memory PSI full percent over the window (0: off)"),
    Setting("qos.memoryDistressPSIFullOffPercent", "qos.memory_distress_psi_full_off",
            ("--memory-distress-psi-full-off-percent",), percent,
            "the PSI distress signal turns off below this percent (0: half of the on one)"),
    Setting("qos.memoryDistressReclaimPagesPerSecond", "qos.memory_distress_reclaim_on",
            ("--memory-distress-reclaim-pages-per-second",), non_negative,
            "evict BE pods at this reclaim scan rate, pages/s (0: off)"),
    Setting("qos.memoryDistressReclaimOffPagesPerSecond", "qos.memory_distress_reclaim_off",
            ("--memory-distress-reclaim-off-pages-per-second",), non_negative,
            "the reclaim distress signal turns off below this rate (0: half of the on rate)"),
    Setting("qos.memoryDistressWindow", "qos.memory_distress_window",
            ("--memory-distress-window",), positive_duration,
            "window of the memory distress rates"),
    Setting("qos.memoryDistressSustain", "qos.memory_distress_sustain",
            ("--memory-distress-sustain",), duration_or_zero,
            "a distress signal must hold this long before it turns on"),
    Setting("qos.memoryDistressInterval", "qos.memory_distress_interval",
            ("--memory-distress-interval",), positive_duration,
            "seconds between two readings of the distress counters"),
    Setting("qos.beEvictionConditionCoolDown", "qos.be_eviction_condition_cool_down",
            ("--be-eviction-condition-cool-down",), positive_duration,
            "lift the BE eviction Node condition this long after the last eviction"),
    Setting("qos.onlyEvictByAPI", "qos.only_evict_by_api", ("--only-evict-by-api",), boolean,
            "cluster mode: never kill when the Eviction API fails", "--only-evict-by-api",
            is_bool=True),
    Setting("kube.kubeconfig", "kube.kubeconfig", ("--kubeconfig",), optional_file,
            "kubeconfig file ('' for $KUBECONFIG, else in-cluster)", "--kubeconfig"),
    Setting("kube.syncTimeout", "kube.sync_timeout", ("--kube-sync-timeout",),
            positive_duration, "wait for the first API sync before protect-only mode"),
    Setting("kube.requestTimeout", "kube.request_timeout", ("--kube-request-timeout",),
            positive_duration, "time one API request may take"),
    Setting("kube.enableNodeMetricReport", "kube.enable_node_metric_report",
            ("--enable-node-metric-report",), boolean, "write the NodeMetric status",
            "--enable-node-metric-report", is_bool=True),
    Setting("kube.kubeletConfigFile", "kube.kubelet_config_file", ("--kubelet-config-file",),
            optional_file, "kubelet config file (topology policy, reserved resources)"),
    Setting("kube.kubeletTopologyPolicy", "kube.kubelet_topology_policy",
            ("--kubelet-topology-manager-policy",),
            choice("", "none", "best-effort", "restricted", "single-numa-node"),
            "kubelet topology manager policy when its config file does not say"),
    Setting("kube.kubeletTopologyScope", "kube.kubelet_topology_scope",
            ("--kubelet-topology-manager-scope",), choice("", "container", "pod"),
            "kubelet topology manager scope when its config file does not say"),
    Setting("kube.podsSource", "kube.pods_source", ("--pods-source",),
            choice("apiserver", "kubelet", "both"), "cluster mode: apiserver, kubelet or both"),
    Setting("kube.kubeletAddress", "kube.kubelet_address", ("--kubelet-address",),
            optional_host, "kubelet host name or IP ('' for the Node's address)"),
    Setting("kube.kubeletPreferredAddressType", "kube.kubelet_preferred_address_type",
            ("--kubelet-preferred-address-type",), nonempty,
            "Node address type to reach the kubelet", "--kubelet-preferred-address-type"),
    Setting("kube.kubeletPort", "kube.kubelet_port", ("--kubelet-port",), tcp_port(True),
            "kubelet HTTPS port (0 for the Node's)"),
    Setting("kube.kubeletInsecureTLS", "kube.kubelet_insecure_tls", ("--kubelet-insecure-tls",),
            boolean, "HTTP to the kubelet's read-only port", "--kubelet-insecure-tls",
            is_bool=True),
    Setting("kube.kubeletReadOnlyPort", "kube.kubelet_read_only_port",
            ("--kubelet-read-only-port",), tcp_port(False), "kubelet read-only port",
            "--kubelet-read-only-port"),
    Setting("kube.kubeletTokenFile", "kube.kubelet_token_file", ("--kubelet-token-file",),
            optional_file, "bearer token file for the kubelet ('' for none)"),
    Setting("kube.kubeletCAFile", "kube.kubelet_ca_file", ("--kubelet-ca-file",),
            optional_file, "CA of the kubelet's certificate ('' to skip verification)"),
    Setting("kube.kubeletSyncInterval", "kube.kubelet_sync_interval",
            ("--kubelet-sync-interval",), positive_duration, "interval between kubelet polls",
            "--kubelet-sync-interval"),
    Setting("kube.kubeletSyncTimeout", "kube.kubelet_sync_timeout", ("--kubelet-sync-timeout",),
            positive_duration, "time one kubelet request may take", "--kubelet-sync-timeout"),
    Setting("runtimeHooks.addr", "runtime_hooks.addr", ("--runtime-hooks-addr",),
            optional_socket, "hook server unix socket ('' disables it)", "--runtime-hooks-addr"),
    Setting("runtimeHooks.hostEndpoint", "runtime_hooks.host_endpoint",
            ("--runtime-hooks-host-endpoint",), abs_path,
            "the hook socket as the host sees it (for koord-runtime-proxy)",
            "--runtime-hooks-host-endpoint"),
    Setting("runtimeHooks.configPath", "runtime_hooks.config_path",
            ("--runtime-hooks-config-path",), abs_path,
            "folder of koord-runtime-proxy's hook-server files", "--runtime-hooks-config-path"),
    Setting("runtimeHooks.disableStages", "runtime_hooks.disable_stages",
            ("--runtime-hooks-disable-stages",), hook_stages,
            "runtime hook stages where no hook runs", "--runtime-hooks-disable-stages"),
    Setting("runtimeHooks.timeout", "runtime_hooks.timeout", ("--runtime-hooks-timeout",),
            positive_duration, "time one request's hooks may take before it goes on unchanged"),
    Setting("runtimeHooks.reconcileInterval", "runtime_hooks.reconcile_interval",
            ("--runtime-hooks-reconcile-interval",), positive_duration,
            "interval of the reconciler applying the hooks to running pods' cgroups",
            "--runtime-hooks-reconcile-interval"),
    Setting("runtimeHooks.nri", "runtime_hooks.nri", ("--enable-nri-runtime-hook",), boolean,
            "register as an NRI plugin with the runtime", "--enable-nri-runtime-hook",
            is_bool=True),
    Setting("runtimeHooks.varRunRootDir", "runtime_hooks.var_run_root", ("--var-run-root-dir",),
            abs_path, "the host's /var/run", "--var-run-root-dir"),
    Setting("runtimeHooks.nriSocketPath", "runtime_hooks.nri_socket_path",
            ("--runtime-hooks-nri-socket-path",), nonempty,
            "NRI socket (relative to --var-run-root-dir)", "--runtime-hooks-nri-socket-path"),
    Setting("runtimeHooks.nriPluginName", "runtime_hooks.nri_plugin_name",
            ("--runtime-hooks-nri-plugin-name",), plugin_name, "NRI plugin name",
            "--runtime-hooks-nri-plugin-name"),
    Setting("runtimeHooks.nriPluginIndex", "runtime_hooks.nri_plugin_index",
            ("--runtime-hooks-nri-plugin-index",), plugin_index, "NRI plugin index",
            "--runtime-hooks-nri-plugin-index"),
    Setting("runtimeHooks.nriConnectTimeout", "runtime_hooks.nri_connect_timeout",
            ("--runtime-hooks-nri-connect-timeout",), positive_duration,
            "time to connect and register with NRI", "--runtime-hooks-nri-connect-timeout"),
    Setting("runtimeHooks.nriBackoffDuration", "runtime_hooks.nri_backoff_duration",
            ("--runtime-hooks-nri-backoff-duration",), positive_duration,
            "first NRI reconnect delay", "--runtime-hooks-nri-backoff-duration"),
    Setting("runtimeHooks.nriBackoffFactor", "runtime_hooks.nri_backoff_factor",
            ("--runtime-hooks-nri-backoff-factor",), factor, "NRI reconnect delay multiplier",
            "--runtime-hooks-nri-backoff-factor"),
    Setting("runtimeHooks.nriBackoffCap", "runtime_hooks.nri_backoff_cap",
            ("--runtime-hooks-nri-backoff-cap",), positive_duration,
            "longest NRI reconnect delay", "--runtime-hooks-nri-backoff-cap"),
    Setting("runtimeHooks.terwayQoSDir", "runtime_hooks.terway_qos_dir",
            ("--runtime-hooks-terway-qos-dir",), abs_path,
            "terway-qos's folder, for the TerwayQoS hook's files"),
    Setting("audit.logDir", "audit.log_dir", ("--audit-log-dir",), optional_abs_path,
            "audit log directory ('' for <state-dir>/audit)", "--audit-log-dir"),
    Setting("audit.maxDiskSpaceMB", "audit.max_disk_space_mb", ("--audit-max-disk-space-mb",),
            disk_mb, "MiB the audit log may take on disk", "--audit-max-disk-space-mb"),
)
# fmt: on
"""Every setting but the feature gates (``featureGates`` / ``--feature-gates``), which merge gate
by gate instead of replacing each other."""
FEATURE_GATES_KEY = "featureGates"
"""The YAML key of the feature gates: a mapping of gate → bool, or a ``--feature-gates`` string."""

BY_KEY = {s.key: s for s in SETTINGS}
"""Each setting by its YAML key path."""
SECTIONS = ("paths", "cgroup", "collect", "server", "qos", "audit", "kube", "runtimeHooks")
"""The YAML file's sections; their settings' keys are ``<section>.<name>``."""
_LONG_FLAGS = {f[2:] for s in SETTINGS for f in s.flags}
_LONG_FLAGS |= {"config", "feature-gates", "version", "help"}
_METAVARS: Mapping[Callable[[object], Any], str] = {
    positive_duration: "DURATION",
    duration_or_zero: "DURATION",
    percent: "PERCENT",
    non_negative: "NUMBER",
    abs_path: "DIR",
    addr: "HOST:PORT",
    optional_path: "FILE",
    optional_host: "HOST",
    optional_file: "FILE",
    optional_abs_path: "DIR",
    strategy_names: "A,B",
    disk_mb: "MIB",
    hook_stages: "A,B",
    optional_socket: "SOCKET",
}
_DEFAULT_TEXT = {
    "nodeName": "$NODE_NAME, else the host name",
    "nodesloFile": f"{DEFAULT_NODESLO_FILE} if it exists",
    "qos.dryRunStrategies": "none",
    "audit.logDir": "<state-dir>/audit",
}


class _Parser(SuggestingParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(suggestion(self, message), source="command line")


def attr_of(obj: Any, path: str) -> Any:
    """The value at a dotted attribute path (``collect.res_used_interval``) of ``obj``."""
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _default_text(setting: Setting) -> str:
    if setting.key in _DEFAULT_TEXT:
        return _DEFAULT_TEXT[setting.key]
    value = attr_of(KoordletConfig(node_name="-"), setting.attr)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}s"
    return str(value)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's raw-description formatter, sized to the terminal without ``shutil``: argparse
    builds a formatter for every flag it adds, and its default imports ``shutil`` (and with it
    ``bz2`` and ``lzma``) to learn the width, 0.3 MiB the daemon would keep for ``--help``.
    The width is found as ``shutil.get_terminal_size`` finds it: ``$COLUMNS``, then standard
    output's terminal, then 80."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        if width is None:
            width = _terminal_columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)


def _terminal_columns() -> int:
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


def build_parser(commands: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The command-line parser; ``--help`` lists every flag with its default and Koordinator's
    name for it, then the feature gates, then ``commands`` (name → one line), the subcommands
    the entry point takes instead of flags."""
    epilog = "feature gates (--feature-gates):\n  " + "\n  ".join(help_lines())
    usage = None
    if commands:
        width = max(len(name) for name in commands)
        epilog += "\n\ncommands (koordlet COMMAND --help for their options):\n" + "\n".join(
            f"  {name:<{width}}  {text}" for name, text in commands.items()
        )
        usage = "koordlet [FLAGS]\n       koordlet {" + ",".join(commands) + "} ..."
    parser = _Parser(
        prog="koordlet",
        usage=usage,
        description="koordinator-py's koordlet: Koordinator's node agent, in Python.",
        epilog=epilog,
        formatter_class=_Formatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=VERSION_TEXT)
    parser.add_argument(
        "-v",
        "--verbose",
        nargs="?",
        const="4",
        metavar="N",
        default=argparse.SUPPRESS,
        help="debug logging, tracebacks of start-up failures included (as --log-level debug); "
        "a klog verbosity N below 4 keeps info (default: off; Koordinator: -v)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="YAML file with these settings; flags override it (default: none)",
    )
    parser.add_argument(
        FEATURE_GATES_FLAG,
        dest=FEATURE_GATES_KEY,
        action="append",
        metavar="A=true,B=false",
        default=argparse.SUPPRESS,
        help="feature gates, listed below; repeatable (default: Koordinator's defaults; "
        "Koordinator: --feature-gates)",
    )
    for s in SETTINGS:
        mirror = f"; Koordinator: {s.koordinator}" if s.koordinator else ""
        text = f"{s.help} (default: {_default_text(s)}{mirror})"
        if s.is_bool:
            parser.add_argument(
                *s.flags, dest=s.key, nargs="?", const="true", metavar="BOOL", help=text,
                default=argparse.SUPPRESS,
            )  # fmt: skip
        else:
            metavar = _METAVARS.get(s.convert, "VALUE")
            parser.add_argument(
                *s.flags, dest=s.key, metavar=metavar, help=text, default=argparse.SUPPRESS
            )
    return parser


def go_style(argv: Sequence[str]) -> list[str]:
    """Go's flag package also takes ``-name``: rewrite ``-addr=:9316`` as ``--addr=:9316``."""
    out = []
    for arg in argv:
        if arg[:1] == "-" and arg[:2] != "--" and arg[1:].partition("=")[0] in _LONG_FLAGS:
            arg = "-" + arg
        out.append(arg)
    return out
