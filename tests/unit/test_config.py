"""Configuration: Koordinator's flags, the YAML file, precedence, errors, and the CLI on top."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import uvloop
import yaml
from hypothesis import given
from hypothesis import strategies as st

import koordlet
from koordlet.cli import main
from koordlet.config import (
    DEFAULT_NODESLO_FILE,
    SETTINGS,
    VERSION_TEXT,
    KoordletConfig,
    config_as_dict,
    duration_seconds,
    load_config,
    load_node_slo,
)
from koordlet.errors import ConfigError
from koordlet.features import FeatureGates

ENV = {"NODE_NAME": "node-a"}
REPO = Path(__file__).resolve().parents[2]


def load(*argv: str, **kw: Any) -> KoordletConfig:
    kw.setdefault("environ", ENV)
    kw.setdefault("default_nodeslo_file", "/nonexistent/nodeslo.yaml")
    return load_config(list(argv), **kw)


def attr(cfg: KoordletConfig, path: str) -> Any:
    obj: Any = cfg
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def write(tmp_path: Path, text: str, name: str = "koordlet.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# One sample per setting: flag value and what it becomes, YAML value and what it becomes.
SAMPLES: dict[str, tuple[str, Any, Any, Any]] = {
    "nodeName": ("worker-7.example", "worker-7.example", "w-1", "w-1"),
    "standalone": ("true", True, True, True),
    "nodesloFile": ("", None, "", None),
    "stateDir": ("/run/koordlet/", "/run/koordlet", "/srv/k", "/srv/k"),
    "logLevel": ("DEBUG", "debug", "warning", "warning"),
    "paths.cgroupRootDir": ("/host-cgroup/", "/host-cgroup", "/c", "/c"),
    "paths.procRootDir": ("/host-proc", "/host-proc", "/p/", "/p"),
    "paths.sysRootDir": ("/host-sys/", "/host-sys", "/s", "/s"),
    "paths.varLibKubeletDir": ("/host/kubelet/", "/host/kubelet", "/k", "/k"),
    "cgroup.version": ("v2", "v2", "v1", "v1"),
    "cgroup.driver": ("systemd", "systemd", "cgroupfs", "cgroupfs"),
    "cgroup.kubeDir": ("kubepods.slice", "kubepods.slice", "k8s/kubepods/", "k8s/kubepods/"),
    "collect.resUsedInterval": ("500ms", 0.5, 2, 2.0),
    "collect.nodeCPUInfoInterval": ("2m", 120.0, "90s", 90.0),
    "collect.nodeStorageInfoInterval": ("5s", 5.0, "2s", 2.0),
    "collect.psiInterval": ("30", 30.0, 0.25, 0.25),
    "collect.cpiInterval": ("2m", 120.0, "90s", 90.0),
    "collect.cpiTimeWindow": ("5s", 5.0, 15, 15.0),
    "collect.coldPageInterval": ("10s", 10.0, 2, 2.0),
    "collect.coldPageAge": ("2m", 120.0, 30, 30.0),
    "collect.enableResctrlCollector": ("true", True, True, True),
    "collect.resctrlInterval": ("2s", 2.0, "500ms", 0.5),
    "server.addr": (":9400", ":9400", "[::1]:9400", "[::1]:9400"),
    "qos.reconcileInterval": ("2s", 2.0, 3, 3.0),
    "qos.cpuSuppressInterval": ("500ms", 0.5, "2s", 2.0),
    "qos.cpuEvictInterval": ("3", 3.0, "1s", 1.0),
    "qos.memoryEvictInterval": ("2", 2.0, 0.5, 0.5),
    "qos.memoryEvictCoolTime": ("8", 8.0, "10s", 10.0),
    "qos.cpuEvictCoolTime": ("40", 40.0, "1m", 60.0),
    "qos.memoryDistressPSIFullPercent": ("10", 10.0, 12.5, 12.5),
    "qos.memoryDistressPSIFullOffPercent": ("4", 4.0, 5, 5.0),
    "qos.memoryDistressReclaimPagesPerSecond": ("20000", 20000.0, 5e4, 50000.0),
    "qos.memoryDistressReclaimOffPagesPerSecond": ("1000", 1000.0, 2000, 2000.0),
    "qos.memoryDistressWindow": ("1s", 1.0, "500ms", 0.5),
    "qos.memoryDistressSustain": ("0", 0.0, "200ms", 0.2),
    "qos.memoryDistressInterval": ("100ms", 0.1, 0.25, 0.25),
    "qos.beEvictionConditionCoolDown": ("10m", 600.0, 60, 60.0),
    "qos.onlyEvictByAPI": ("true", True, True, True),
    "qos.evictMaxPerRound": ("3", 3, 10, 10),
    "qos.evictDedupeWindow": ("5m", 300.0, 60, 60.0),
    "kube.kubeconfig": (
        "/etc/k/admin.conf",
        "/etc/k/admin.conf",
        "/root/.kube/config",
        "/root/.kube/config",
    ),
    "kube.syncTimeout": ("10s", 10.0, 5, 5.0),
    "kube.requestTimeout": ("1m", 60.0, "15s", 15.0),
    "kube.enableNodeMetricReport": ("false", False, False, False),
    "kube.kubeletConfigFile": ("/etc/kubelet.yaml", "/etc/kubelet.yaml", "", ""),
    "kube.kubeletTopologyPolicy": (
        "restricted",
        "restricted",
        "single-numa-node",
        "single-numa-node",
    ),
    "kube.kubeletTopologyScope": ("pod", "pod", "container", "container"),
    "kube.podsSource": ("kubelet", "kubelet", "both", "both"),
    "kube.kubeletAddress": ("10.0.0.7", "10.0.0.7", "node-1.local", "node-1.local"),
    "kube.kubeletPreferredAddressType": ("Hostname", "Hostname", "ExternalIP", "ExternalIP"),
    "kube.kubeletPort": ("10250", 10250, 0, 0),
    "kube.kubeletInsecureTLS": ("true", True, True, True),
    "kube.kubeletReadOnlyPort": ("10256", 10256, 10255, 10255),
    "kube.kubeletTokenFile": ("/run/token", "/run/token", "", ""),
    "kube.kubeletCAFile": ("/etc/ca.pem", "/etc/ca.pem", "", ""),
    "kube.kubeletSyncInterval": ("5s", 5.0, 20, 20.0),
    "kube.kubeletSyncTimeout": ("1s", 1.0, 2, 2.0),
    "server.debugAllowRemote": ("1", True, "true", True),
    "server.maxRequestsInFlight": ("16", 16, 4, 4),
    "server.cpuShare": ("0.25", 0.25, 0.05, 0.05),
    "qos.dryRun": ("true", True, True, True),
    "qos.dryRunStrategies": (
        "cpusuppress, memoryevict",
        frozenset({"cpusuppress", "memoryevict"}),
        ["cpuburst"],
        frozenset({"cpuburst"}),
    ),
    "audit.logDir": ("/var/log/koordlet/", "/var/log/koordlet", "", ""),
    "audit.maxDiskSpaceMB": ("32", 32, 64, 64),
    "runtimeHooks.addr": (
        "/host-var-run-koordlet/koordlet.sock",
        "/host-var-run-koordlet/koordlet.sock",
        "",
        "",
    ),
    "runtimeHooks.hostEndpoint": ("/run/k/k.sock", "/run/k/k.sock", "/r/k.sock", "/r/k.sock"),
    "runtimeHooks.configPath": ("/host-etc-hookserver/", "/host-etc-hookserver", "/h", "/h"),
    "runtimeHooks.disableStages": (
        "PreStartContainer, PostStopContainer",
        frozenset({"PreStartContainer", "PostStopContainer"}),
        ["PreCreateContainer"],
        frozenset({"PreCreateContainer"}),
    ),
    "runtimeHooks.timeout": ("250ms", 0.25, 2, 2.0),
    "runtimeHooks.reconcileInterval": ("30s", 30.0, 5, 5.0),
    "runtimeHooks.nri": ("false", False, False, False),
    "runtimeHooks.varRunRootDir": ("/host-var-run/", "/host-var-run", "/v", "/v"),
    "runtimeHooks.nriSocketPath": ("nri.sock", "nri.sock", "/run/nri.sock", "/run/nri.sock"),
    "runtimeHooks.nriPluginName": ("koordlet", "koordlet", "k_nri", "k_nri"),
    "runtimeHooks.nriPluginIndex": ("10", "10", "99", "99"),
    "runtimeHooks.nriConnectTimeout": ("3s", 3.0, "1m", 60.0),
    "runtimeHooks.nriBackoffDuration": ("500ms", 0.5, 2, 2.0),
    "runtimeHooks.nriBackoffFactor": ("1.5", 1.5, 3, 3.0),
    "runtimeHooks.nriBackoffCap": ("1m", 60.0, "10s", 10.0),
    "runtimeHooks.terwayQoSDir": ("/host-terway/qos/", "/host-terway/qos", "/t", "/t"),
}


def test_there_is_a_sample_for_every_setting() -> None:
    assert set(SAMPLES) == {s.key for s in SETTINGS}


def test_without_flags_the_defaults_apply() -> None:
    cfg = load()
    assert cfg == KoordletConfig(node_name="node-a")
    assert cfg.server.addr == "127.0.0.1:9316"
    assert cfg.collect.res_used_interval == 1.0
    assert cfg.collect.node_cpu_info_interval == 60.0
    assert cfg.cgroup.kube_path == "kubepods/"
    assert cfg.paths.cgroup_root == "/sys/fs/cgroup"
    assert cfg.feature_gates == FeatureGates()


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.key)
def test_every_flag_and_each_alias_sets_its_setting(setting: Any) -> None:
    flag_value, want, _, _ = SAMPLES[setting.key]
    for flag in setting.flags:
        assert attr(load(f"{flag}={flag_value}"), setting.attr) == want, flag
        assert attr(load(flag, flag_value), setting.attr) == want, flag


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.key)
def test_every_setting_can_come_from_the_config_file(tmp_path: Path, setting: Any) -> None:
    _, _, yaml_value, want = SAMPLES[setting.key]
    section, _, name = setting.key.rpartition(".")
    doc = {section: {name: yaml_value}} if section else {name: yaml_value}
    cfg = load("--config", write(tmp_path, yaml.safe_dump(doc)))
    assert attr(cfg, setting.attr) == want


def test_flags_override_the_file_and_the_file_overrides_the_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "server:\n  addr: ':9500'\ncollect:\n  resUsedInterval: 2s\n")
    cfg = load("--config", path, "--addr", "127.0.0.1:9600")
    assert cfg.server.addr == "127.0.0.1:9600"
    assert cfg.collect.res_used_interval == 2.0
    assert cfg.collect.psi_interval == 10.0
    assert cfg.config_file == path


def test_feature_gates_merge_gate_by_gate_across_file_and_flags(tmp_path: Path) -> None:
    path = write(tmp_path, "featureGates:\n  PSICollector: true\n  CPUBurst: false\n")
    cfg = load("--config", path, "--feature-gates=CPUBurst=true", "-feature-gates=AllAlpha=true")
    gates = cfg.feature_gates
    assert (gates.enabled("PSICollector"), gates.enabled("CPUBurst")) == (True, True)
    assert gates.enabled("BECPUEvict") is True
    string_form = write(tmp_path, "featureGates: PSICollector=true\n", "gates.yaml")
    assert load("--config", string_form).feature_gates.enabled("PSICollector") is True


def test_go_single_dash_flags_as_in_koordinators_daemonset_are_accepted() -> None:
    cfg = load("-cgroup-root-dir=/host-cgroup/", "-addr=:9316", "-feature-gates=AllBeta=false")
    assert cfg.paths.cgroup_root == "/host-cgroup"
    assert cfg.server.addr == ":9316"
    assert cfg.feature_gates.enabled("CPUBurst") is False


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        *[("1s", 1.0), ("500ms", 0.5), ("1m", 60.0), ("1h30m", 5400.0), ("1m30.5s", 90.5)],
        *[("250us", 250e-6), ("250µs", 250e-6), ("10ns", 1e-8), ("-1.5h", -5400.0), ("0", 0.0)],
        *[("1.5", 1.5), ("2", 2.0), (".5s", 0.5), ("+3s", 3.0)],
    ],
)
def test_durations_are_read_as_go_writes_them_or_as_plain_seconds(
    text: str, seconds: float
) -> None:
    assert duration_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "1x", "1 s", "1s2", "ms", "1e3s", "inf", "nan", "--1s"])
def test_malformed_durations_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        duration_seconds(text)


@given(
    st.lists(
        st.tuples(st.integers(0, 10**6), st.sampled_from(["h", "m", "s", "ms", "us", "ns"])),
        min_size=1,
        max_size=5,
    )
)
def test_a_go_duration_is_the_sum_of_its_parts(parts: list[tuple[int, str]]) -> None:
    unit = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    text = "".join(f"{n}{u}" for n, u in parts)
    total = sum(n * unit[u] for n, u in parts)
    if total * 1e9 > 2**63 - 1:
        # Go's time.ParseDuration refuses what int64 nanoseconds cannot hold (about 2,562,047 h).
        with pytest.raises(ValueError, match="invalid duration"):
            duration_seconds(text)
        return
    assert duration_seconds(text) == pytest.approx(total)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--collect-res-used-interval-seconds=-1s"], "must be a positive duration, got '-1s'"),
        (["--collect-node-cpu-info-interval=0"], "must be a positive duration"),
        (["--psi-collector-interval-seconds=soon"], "invalid duration 'soon'"),
        (["--addr=9316"], "must be HOST:PORT"),
        (["--addr=::1:9316"], "needs brackets"),
        (["--addr=[::g]:9316"], "bad IPv6 address"),
        (["--addr=:70000"], "port in 0..65535"),
        (["--cgroup-root-dir=host-cgroup"], "must be an absolute path"),
        (["--cgroup-kube-dir=/kubepods"], "relative directory"),
        (["--cgroup-kube-path=../kubepods"], "relative directory"),
        (["--cgroup-kube-dir=kubepods/burstable"], "must end in kubepods/ or kubepods.slice/"),
        (["--cgroup-version=v3"], "must be one of auto, v1, v2"),
        (["--cgroup-driver=docker"], "must be one of auto, systemd, cgroupfs"),
        (["--log-level=verbose"], "must be one of debug"),
        (["--node-name=Node_1"], "valid Kubernetes node name"),
        (["--standalone=maybe"], "invalid bool value 'maybe'"),
        (["--feature-gates=CPUBrust=true"], "CPUBrust: unknown feature gate"),
        (["--nodeslo-file=/etc/x.yaml"], "only used with --standalone"),
        (["--server-cpu-share=0"], "must be above 0 and at most 1"),
        (["--server-cpu-share=1.5"], "must be above 0 and at most 1"),
        (["--server-cpu-share=a-tenth"], "must be a number"),
        (["--server-max-requests-in-flight=0"], "must be between 1 and 1000"),
    ],
)
def test_a_bad_flag_value_is_an_error_naming_the_flag(argv: list[str], message: str) -> None:
    flag = argv[0].partition("=")[0]
    primary = next((s.flags[0] for s in SETTINGS if flag in s.flags), flag)
    with pytest.raises(ConfigError, match=f"^{re.escape(primary)}: .*{re.escape(message)}"):
        load(*argv)


@pytest.mark.parametrize("argv", [["--adr=:1"], ["--add=:1"], ["--addr"], ["stray"]])
def test_unknown_abbreviated_or_incomplete_flags_are_errors(argv: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"^command line: "):
        load(*argv)


@pytest.mark.parametrize(
    ("argv", "level"),
    [(["-v"], "debug"), (["--verbose"], "debug"), (["-v=4"], "debug"), (["-v", "2"], "info"),
     (["--log-level", "warning", "-v"], "debug"), ([], "info")],
)  # fmt: skip
def test_v_turns_on_debug_logging_as_klog_verbosity_4_and_above(
    argv: list[str], level: str
) -> None:
    assert load(*argv).log_level == level


def test_an_unknown_flag_suggests_the_closest_known_one() -> None:
    with pytest.raises(
        ConfigError, match=r"unrecognized arguments: --adr=:1 \(did you mean --addr\?\)"
    ):
        load("--adr=:1")


@pytest.mark.parametrize("value", ["https://10.0.0.7", "10.0.0.7:10250", "a b"])
def test_the_kubelet_address_is_a_host_only(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^--kubelet-address: must be a host name or IP"):
        load("--kubelet-address", value)
    assert load("--kubelet-address", "fe80::1").kube.kubelet_address == "fe80::1"


def test_switches_take_an_optional_go_bool() -> None:
    assert load("--standalone").standalone is True
    assert load("--standalone=false").standalone is False
    assert load("--debug-allow-remote=1").server.debug_allow_remote is True


def test_a_cpi_window_not_shorter_than_its_interval_is_refused_naming_the_field(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match="CPI window") as flag_err:
        load("--collect-cpi-timewindow=60s")
    path = write(tmp_path, "collect:\n  cpiInterval: 20s\n  cpiTimeWindow: 30s\n")
    with pytest.raises(ConfigError, match=r"collect\.cpiTimeWindow") as file_err:
        load("--config", path)
    assert "--collect-cpi-timewindow" in str(flag_err.value)
    assert path in str(file_err.value)


def test_the_listen_address_splits_into_host_and_port() -> None:
    assert (load("--addr=:9316").server.host, load("--addr=:9316").server.port) == ("", 9316)
    v6 = load("--addr=[::1]:0").server
    assert (v6.host, v6.port) == ("::1", 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "collect:\n  resUsedInterval: -1s\n",
            "collect.resUsedInterval: must be a positive duration",
        ),
        (
            "collect:\n  resUsedIntervall: 1s\n",
            "collect.resUsedIntervall: unknown setting (did you",
        ),
        ("resUsedInterval: 1s\n", "resUsedInterval: unknown setting (did you mean 'collect.resUse"),
        ("addr: ':1'\n", "addr: unknown setting"),
        ("server: ':9316'\n", "server: must be a mapping"),
        ("standalone: 'perhaps'\n", "standalone: invalid bool value"),
        ("nodeName: 12\n", "nodeName: must be a string"),
        ("collect:\n  psiInterval: true\n", "collect.psiInterval: must be a duration"),
        ("featureGates:\n  CPUBrust: true\n", "featureGates: CPUBrust: unknown feature gate"),
        ("featureGates:\n  CPUBurst: sometimes\n", "featureGates: CPUBurst: invalid bool"),
        ("featureGates: [CPUBurst]\n", "featureGates: must be a mapping"),
        ("- addr: ':1'\n", "must be a mapping of settings"),
        ("addr: 1\naddr: 2\n", "invalid YAML: line 2, column 1: duplicate key 'addr'"),
        ("server: {addr: [\n", "invalid YAML: line 2"),
    ],
)
def test_a_bad_config_file_is_an_error_naming_the_file_and_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=f"^{re.escape(path)}: {re.escape(message)}"):
        load("--config", path)


def test_the_error_for_a_bad_duration_in_the_file_reads_as_documented(tmp_path: Path) -> None:
    path = write(tmp_path, "collect:\n  resUsedInterval: -1s\n")
    with pytest.raises(ConfigError) as err:
        load("--config", path)
    assert (
        str(err.value) == f"{path}: collect.resUsedInterval: must be a positive duration, got '-1s'"
    )
    assert (err.value.source, err.value.field) == (path, "collect.resUsedInterval")


def test_an_unreadable_config_file_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match=f"^{re.escape(str(missing))}: cannot read"):
        load("--config", str(missing))


def test_null_and_empty_documents_leave_the_defaults(tmp_path: Path) -> None:
    assert load("--config", write(tmp_path, "")) == KoordletConfig(
        node_name="node-a", config_file=str(tmp_path / "koordlet.yaml")
    )
    cfg = load("--config", write(tmp_path, "server:\n  addr:\ncollect:\n", "nulls.yaml"))
    assert cfg.server.addr == "127.0.0.1:9316"


def test_the_node_name_comes_from_node_name_then_the_host_name() -> None:
    assert load(environ={"NODE_NAME": "from-env"}).node_name == "from-env"
    assert load("--node-name=flag", environ={"NODE_NAME": "from-env"}).node_name == "flag"
    hostname = load(environ={}).node_name
    assert hostname
    assert hostname == hostname.lower()
    with pytest.raises(ConfigError, match=r"^NODE_NAME: must be a valid Kubernetes node name"):
        load(environ={"NODE_NAME": "Bad_Name"})


def test_standalone_reads_the_default_nodeslo_file_only_when_it_exists(tmp_path: Path) -> None:
    present = write(tmp_path, "hostApplications: []\n", "nodeslo.yaml")
    assert load("--standalone", default_nodeslo_file=present).nodeslo_file == present
    assert load("--standalone").nodeslo_file is None  # default path absent
    assert load(default_nodeslo_file=present).nodeslo_file is None  # not standalone
    assert (
        load("--standalone", "--nodeslo-file=", default_nodeslo_file=present).nodeslo_file is None
    )
    assert DEFAULT_NODESLO_FILE == "/etc/koordinator/nodeslo.yaml"


def test_a_relative_nodeslo_path_is_relative_to_the_cwd_or_to_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    path = write(conf_dir, "standalone: true\nnodesloFile: slo/node.yaml\n")
    assert load("--config", path).nodeslo_file == str(conf_dir / "slo/node.yaml")
    monkeypatch.chdir(tmp_path)
    assert load("--standalone", "--nodeslo-file=x.yaml").nodeslo_file == str(tmp_path / "x.yaml")


def test_config_as_dict_is_json_and_loads_back_to_the_same_config(tmp_path: Path) -> None:
    cfg = load(
        "--standalone",
        "--nodeslo-file=/etc/slo.yaml",
        "--addr=:9400",
        "--collect-res-used-interval=250ms",
        "--feature-gates=AllAlpha=true,CPUBurst=false",
        "--log-level=debug",
    )
    dumped = config_as_dict(cfg)
    assert json.loads(json.dumps(dumped)) == dumped
    assert dumped["collect"]["resUsedInterval"] == 0.25
    assert dumped["featureGates"]["CPUBurst"] is False
    again = load("--config", write(tmp_path, yaml.safe_dump(dumped)))
    assert again == dataclasses.replace(cfg, config_file=again.config_file)


def test_load_node_slo_reports_a_bad_file_as_a_config_error(tmp_path: Path) -> None:
    path = write(tmp_path, "hostApplications:\n- name: a\n  qos: XX\n", "slo.yaml")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: hostApplications[0].qos: unknown")):
        load_node_slo(path)


def test_the_docs_name_every_flag_yaml_key_and_koordinator_name() -> None:
    doc = (REPO / "docs" / "configuration.md").read_text()
    for s in SETTINGS:
        for name in (*s.flags, s.key, s.koordinator):
            assert f"`{name}`" in doc or not name, name
    for name in ("--config", "--feature-gates", "featureGates", "--version", "AllAlpha"):
        assert f"`{name}`" in doc, name


# The command ------------------------------------------------------------------------------------
def test_version_prints_the_version_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"koordlet (koordinator-py) {koordlet.__version__}"
    assert VERSION_TEXT.endswith(koordlet.__version__)


def test_help_lists_every_flag_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for s in SETTINGS:
        for flag in s.flags:
            assert flag in out
    assert out.count("(default:") == len(SETTINGS) + 3  # + --config, --feature-gates, -v
    assert "CPUBurst=true|false (BETA - default=true" in out
    assert "--kubelet-address HOST" in out  # not FILE
    assert "NodeTopologyReport=true|false (BETA - default=true)" in out  # implemented here


@pytest.mark.parametrize(
    ("files", "argv", "message"),
    [
        ({"conf": "server:\n  adr: ':1'\n"}, ["--config", "{conf}"], "{conf}: server.adr"),
        ({}, ["--addr", "nowhere"], "--addr: must be HOST:PORT"),
        ({}, ["--bogus"], "command line: unrecognized arguments: --bogus"),
        (
            {"slo": "spec:\n  hostApplications:\n  - name: a\n    qos: XX\n"},
            ["--standalone", "--nodeslo-file", "{slo}"],
            "{slo}: spec.hostApplications[0].qos: unknown QoS 'XX'",
        ),
        ({}, ["--standalone", "--nodeslo-file", "{missing}"], "{missing}: cannot read"),
    ],
)
def test_a_bad_configuration_exits_2_naming_file_and_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    files: dict[str, str],
    argv: list[str],
    message: str,
) -> None:
    names = {name: write(tmp_path, text, name) for name, text in files.items()}
    names["missing"] = str(tmp_path / "missing.yaml")
    assert main([a.format_map(names) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"koordlet: {message.format_map(names)}")
    assert len(err.splitlines()) == 1


class FakeDaemon(types.ModuleType):
    """Stands in for ``koordlet.daemon``: records what ``run`` saw and does what it is told."""

    def __init__(self, behaviour: Callable[[KoordletConfig], int]) -> None:
        super().__init__("koordlet.daemon")
        self.behaviour = behaviour
        self.seen: list[tuple[KoordletConfig, bool, int]] = []

    async def run(self, cfg: KoordletConfig, *, own_process: bool = False) -> int:
        assert own_process  # the entry point owns its process: the daemon may tune its GC
        on_uvloop = isinstance(asyncio.get_running_loop(), uvloop.Loop)
        self.seen.append((cfg, on_uvloop, logging.getLogger().getEffectiveLevel()))
        return self.behaviour(cfg)


@pytest.fixture
def fake_daemon(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeDaemon]:
    def install(behaviour: Callable[[KoordletConfig], int]) -> FakeDaemon:
        fake = FakeDaemon(behaviour)
        monkeypatch.setitem(sys.modules, "koordlet.daemon", fake)
        monkeypatch.setattr(koordlet, "daemon", fake, raising=False)
        return fake

    return install


def test_main_runs_the_daemon_on_uvloop_and_returns_its_exit_code(
    fake_daemon: Callable[..., FakeDaemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_NAME", "node-b")
    fake = fake_daemon(lambda cfg: 3)
    handlers = list(logging.getLogger().handlers)
    assert main(["--standalone", "--nodeslo-file=", "--log-level=debug"]) == 3
    [(cfg, on_uvloop, level)] = fake.seen
    assert (cfg.node_name, cfg.standalone, on_uvloop, level) == (
        "node-b",
        True,
        True,
        logging.DEBUG,
    )
    assert logging.getLogger().handlers == handlers  # its log handler is gone again


def test_ctrl_c_stops_cleanly_with_exit_code_0(
    fake_daemon: Callable[..., FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(cfg: KoordletConfig) -> int:
        raise KeyboardInterrupt

    fake_daemon(interrupted)
    assert main(["--node-name=n1"]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_each_log_record_is_one_line_even_with_a_traceback(
    fake_daemon: Callable[..., FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    def fails_once(cfg: KoordletConfig) -> int:
        try:
            int("first line\nsecond line")
        except ValueError:
            logging.getLogger("koordlet.test").exception("step %s failed", "x")
        return 0

    fake_daemon(fails_once)
    assert main(["--node-name=n1"]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "koordlet.test" in ln]
    assert len(lines) == 1
    assert "ERROR koordlet.test: step x failed" in lines[0]
    assert "Traceback" in lines[0]
    assert "first line\\nsecond line" in lines[0]
