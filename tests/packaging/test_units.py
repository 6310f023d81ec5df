"""The systemd units pass ``systemd-analyze verify``; the shipped configuration files load."""

from __future__ import annotations

import configparser
import shlex
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


def test_the_shipped_configuration_loads_as_the_service_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed, its NodeSLO is /etc/koordinator/nodeslo.yaml; from a checkout (README's
    example) the one beside it: the path is relative to the configuration file."""
    monkeypatch.chdir(REPO)
    etc = tmp_path / "etc/koordinator"
    etc.mkdir(parents=True)
    for name in ("koordlet.yaml", "nodeslo.yaml"):
        shutil.copy(REPO / "packaging/etc" / name, etc / name)
    installed = load_config(["--config", str(etc / "koordlet.yaml"), "--standalone"])
    checkout = load_config(["--config", "packaging/etc/koordlet.yaml"])

    assert installed.standalone is True
    assert installed.nodeslo_file == str(etc / "nodeslo.yaml")
    assert installed.state_dir == "/var/lib/koordlet"
    assert checkout.nodeslo_file == str(REPO / "packaging/etc/nodeslo.yaml")
    load_node_slo(checkout.nodeslo_file)


def test_readmes_example_command_line_loads_from_a_checkout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """README's "Using the koordlet" runs the packaged configuration from a checkout."""
    monkeypatch.chdir(REPO)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    (line,) = [ln for ln in readme.splitlines() if ln.startswith(".venv/bin/koordlet --standalone")]
    args = shlex.split(line.split("#", 1)[0])[1:]

    cfg = load_config(args)

    assert cfg.qos.dry_run is True  # the example changes nothing on the host
    assert cfg.nodeslo_file is not None
    load_node_slo(cfg.nodeslo_file)


def test_the_shipped_nodeslo_is_valid_and_declares_no_application() -> None:
    spec = load_node_slo(str(REPO / "packaging/etc/nodeslo.yaml"))

    assert spec.host_applications == ()
