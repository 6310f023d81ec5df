"""The systemd units pass ``systemd-analyze verify``; the shipped configuration files load."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

from koordlet.config import load_config, load_node_slo
from tests.packaging.conftest import REPO

UNITS = (
    "koordlet.service",
    "koordlet.slice",
    "host-latency-sensitive.slice",
    "host-best-effort.slice",
    "koord-runtime-proxy.service",
)


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(REPO / "systemd" / name)
    return parser


@pytest.fixture
def verifiable_units(tmp_path: Path) -> list[Path]:
    """The units, with ExecStart pointing at an executable that exists here (verify checks it;
    the installed path /usr/bin/koordlet is checked by the package tests)."""
    exe = tmp_path / "koordlet"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    proxy = tmp_path / "koord-runtime-proxy"
    proxy.write_text("#!/bin/sh\n")
    proxy.chmod(0o755)
    out = []
    for name in UNITS:
        text = (REPO / "systemd" / name).read_text()
        text = text.replace("/usr/bin/koordlet", str(exe))
        text = text.replace("/usr/bin/koord-runtime-proxy", str(proxy))
        (tmp_path / name).write_text(text)
        out.append(tmp_path / name)
    return out


def test_units_pass_systemd_analyze_verify_without_a_warning(verifiable_units: list[Path]) -> None:
    analyzer = shutil.which("systemd-analyze")
    if analyzer is None:
        pytest.skip("systemd-analyze not found (apt package systemd)")

    done = subprocess.run(
        [analyzer, "verify", "--man=no", *map(str, verifiable_units)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == ""


def test_the_service_notifies_runs_standalone_in_its_slice_and_restarts_on_failure() -> None:
    service = unit("koordlet.service")["Service"]

    assert service["Type"] == "notify"
    assert service["NotifyAccess"] == "main"
    assert service["WatchdogSec"] == "60s"
    assert service["Restart"] == "on-failure"
    assert service["Slice"] == "koordlet.slice"
    assert service["StateDirectory"] == "koordlet"
    assert service["ExecStart"] == (
        "/usr/bin/koordlet --standalone --config /etc/koordinator/koordlet.yaml"
    )


def test_hardening_leaves_cgroup_and_kernel_tunable_writes_possible() -> None:
    service = unit("koordlet.service")["Service"]

    assert "ProtectControlGroups" not in service
    assert "ProtectKernelTunables" not in service
    assert service["ProtectSystem"] == "full"
    writable = service["ReadWritePaths"].split()
    for path in ("/sys/fs/cgroup", "-/var/lib/koordlet", "-/proc/sys/vm", "-/sys/fs/resctrl"):
        assert path in writable


def test_the_agents_slice_has_a_memory_floor_and_a_cpu_weight() -> None:
    slice_ = unit("koordlet.slice")["Slice"]

    assert slice_["MemoryMin"] == "256M"
    assert slice_["MemoryLow"] == "512M"
    assert int(slice_["CPUWeight"]) > 100


def test_the_shipped_configuration_loads_as_the_service_runs_it() -> None:
    cfg = load_config(["--config", str(REPO / "packaging/etc/koordlet.yaml"), "--standalone"])

    assert cfg.standalone is True
    assert cfg.nodeslo_file == "/etc/koordinator/nodeslo.yaml"
    assert cfg.state_dir == "/var/lib/koordlet"


def test_the_shipped_nodeslo_is_valid_and_declares_no_application() -> None:
    spec = load_node_slo(str(REPO / "packaging/etc/nodeslo.yaml"))

    assert spec.host_applications == ()
