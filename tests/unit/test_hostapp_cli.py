"""``koordlet host-app run|list`` on fake host trees (every cgroup layout) and through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from koordlet import cli, hostapp
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from tests.conftest import LAYOUTS
from tests.fakehost import FakeHost

NODESLO = """\
apiVersion: slo.koordinator.sh/v1alpha1
kind: NodeSLO
spec:
  hostApplications:
  - name: nginx
    qos: LS
    priority: koord-prod
  - name: spin
    qos: BE
  - name: under-be-pods
    qos: BE
    cgroupPath: {base: KubepodsBesteffort, parentDir: hostapps, relativePath: spin}
  - name: by-systemd
    qos: BE
    cgroupPath: {parentDir: host.slice/host-best.slice/host-best-effort.slice,
                 relativePath: by-systemd.service}
"""


class Recorder:
    """Stands in for ``os.execvp``: records the call and returns."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    def __call__(self, file: str, args: list[str]) -> None:
        self.calls.append((file, list(args)))


def flags(fake: FakeHost, nodeslo: Path) -> list[str]:
    return [
        "--nodeslo-file",
        str(nodeslo),
        "--cgroup-root-dir",
        fake.paths.cgroup_root,
        "--cgroup-version",
        fake.layout.version.value,
        "--cgroup-driver",
        fake.layout.driver.value,
    ]


@pytest.fixture
def nodeslo(tmp_path: Path) -> Path:
    path = tmp_path / "nodeslo.yaml"
    path.write_text(NODESLO)
    return path


@pytest.mark.parametrize("fake_host", LAYOUTS, indirect=True, ids=lambda p: f"{p[0]}-{p[1]}")
def test_run_makes_the_default_cgroup_joins_it_and_execs_the_command(
    fake_host: FakeHost, nodeslo: Path
) -> None:
    execs = Recorder()

    code = hostapp.main(
        ["run", *flags(fake_host, nodeslo), "--name", "spin", "--", "sleep", "60"],
        exec_fn=execs,
    )

    assert code == 0
    assert execs.calls == [("sleep", ["sleep", "60"])]
    controllers = ["cpu"] if fake_host.version is CgroupVersion.V2 else list(hostapp.V1_CONTROLLERS)
    for controller in controllers:
        assert fake_host.read(controller, "host-best-effort/spin", "cgroup.procs") == str(
            os.getpid()
        )


def test_a_new_v1_cpuset_level_gets_its_parents_cpus_and_mems(
    host_root: Path, nodeslo: Path
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS, ncpus=4)

    hostapp.main(
        ["run", *flags(fake, nodeslo), "--name", "nginx", "--", "true"], exec_fn=Recorder()
    )

    for level in ("host-latency-sensitive", "host-latency-sensitive/nginx"):
        assert fake.read("cpuset", level, "cpuset.cpus") == "0-3"
        assert fake.read("cpuset", level, "cpuset.mems") == "0"


def test_an_existing_cgroup_is_joined_without_rewriting_its_cpuset(
    host_root: Path, nodeslo: Path
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS, ncpus=4)
    fake.add_host_app_cgroup("host-best-effort/spin")
    fake.write("cpuset", "host-best-effort/spin", "cpuset.cpus", "2-3")

    hostapp.main(["run", *flags(fake, nodeslo), "--name", "spin", "--", "true"], exec_fn=Recorder())

    assert fake.read("cpuset", "host-best-effort/spin", "cpuset.cpus") == "2-3\n"
    assert fake.read("cpuset", "host-best-effort/spin", "cgroup.procs") == str(os.getpid())


def test_a_kubepods_base_follows_the_systemd_drivers_qos_folder(
    host_root: Path, nodeslo: Path
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V2, CgroupDriver.SYSTEMD)

    hostapp.main(
        ["run", *flags(fake, nodeslo), "--name", "under-be-pods", "--", "true"],
        exec_fn=Recorder(),
    )

    rel = "kubepods.slice/kubepods-besteffort.slice/hostapps/spin"
    assert fake.read("cpu", rel, "cgroup.procs") == str(os.getpid())


def test_systemd_owned_names_are_refused_and_nothing_is_created(
    host_root: Path, nodeslo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.SYSTEMD)
    execs = Recorder()

    code = hostapp.main(
        ["run", *flags(fake, nodeslo), "--name", "by-systemd", "--", "true"], exec_fn=execs
    )

    assert code == hostapp.EXIT_CONFIG
    assert execs.calls == []
    assert "systemd" in capsys.readouterr().err
    assert not os.path.exists(fake.layout.abs_dir("cpu", "host.slice"))


def test_an_undeclared_name_is_a_configuration_error_naming_the_declared_ones(
    host_root: Path, nodeslo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)

    code = hostapp.main(
        ["run", *flags(fake, nodeslo), "--name", "mysql", "--", "true"], exec_fn=Recorder()
    )

    assert code == hostapp.EXIT_CONFIG
    err = capsys.readouterr().err
    assert "no host application 'mysql'" in err
    assert "nginx, spin" in err


def test_run_without_a_command_is_refused(host_root: Path, nodeslo: Path) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)

    code = hostapp.main(["run", *flags(fake, nodeslo), "--name", "spin", "--"], exec_fn=Recorder())

    assert code == hostapp.EXIT_CONFIG
    assert not os.path.exists(fake.layout.abs_dir("cpu", "host-best-effort"))


def test_list_reports_declared_apps_present_or_absent_with_their_processes(
    host_root: Path, nodeslo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    fake.add_host_app_cgroup("host-best-effort/spin")
    fake.write("cpu", "host-best-effort/spin", "cgroup.procs", "101\n102")

    code = hostapp.main(["list", *flags(fake, nodeslo), "--json"])

    assert code == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["spin"]["present"] is True
    assert rows["spin"]["processes"] == 2
    assert rows["nginx"]["present"] is False
    assert rows["nginx"]["cgroup"] == "host-latency-sensitive/nginx"
    assert rows["nginx"]["processes"] is None


def test_list_prints_a_table(
    host_root: Path, nodeslo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)

    hostapp.main(["list", *flags(fake, nodeslo)])

    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "QOS", "PRIORITY", "CGROUP", "PRESENT", "PROCS"]
    assert lines[1].split() == [
        "nginx",
        "LS",
        "koord-prod",
        "host-latency-sensitive/nginx",
        "no",
        "-",
    ]


def test_the_koordlet_command_dispatches_host_app_and_keeps_its_own_flags(
    host_root: Path, nodeslo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)

    assert cli.main(["host-app", "list", *flags(fake, nodeslo), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 4
    assert cli.main(["--version"]) == 0
    assert "koordlet (koordinator-py)" in capsys.readouterr().out
    assert cli.main(["--no-such-flag"]) == 2


def test_the_launched_command_really_runs_in_the_launchers_process(
    host_root: Path, nodeslo: Path
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)

    command = ["--name", "spin", "--", "sh", "-c", "echo $$"]

    done = subprocess.run(
        [sys.executable, "-m", "koordlet", "host-app", "run", *flags(fake, nodeslo), *command],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert fake.read("memory", "host-best-effort/spin", "cgroup.procs") == done.stdout.strip()
