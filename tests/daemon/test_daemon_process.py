"""The real ``koordlet`` process: started as a user starts it, probed over HTTP, stopped by signal.

Runs ``python -m koordlet`` (and the ``koordlet`` console script when it is installed) against a
fake host tree and, read-only, against this machine's real roots.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from apis.extension import KubeQOS
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from tests.daemon import Samples, free_port, one_value, parse_samples
from tests.fakehost import FakeHost, container_id

pytestmark = pytest.mark.daemon

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "koordlet"
STOP_WITHIN = 5.0
"""Seconds the process has to exit after SIGTERM or SIGINT."""
UID = "5b0e4c1a-0000-4d2d-9e9e-00000000abcd"


def launcher(script: bool) -> list[str]:
    return [str(SCRIPT)] if script else [sys.executable, "-m", "koordlet"]


@pytest.fixture
def command() -> list[str]:
    return launcher(script=False)


@dataclass
class Proc:
    """A running koordlet and its address."""

    popen: subprocess.Popen[bytes]
    base: str
    log: Path

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def json(self, path: str) -> Any:
        status, text = self.get(path)
        assert status == 200, text
        return json.loads(text)

    def samples(self) -> Samples:
        status, text = self.get("/metrics")
        assert status == 200
        return parse_samples(text)

    def until(self, what: str, check: Any, timeout: float = 20.0) -> Any:
        """Poll ``check()`` until it returns something truthy; fail naming ``what``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.popen.poll() is None, f"koordlet exited: {self.log.read_text()}"
            with contextlib.suppress(OSError):
                got = check()
                if got:
                    return got
            time.sleep(0.1)
        pytest.fail(f"no {what} within {timeout:g}s; log:\n{self.log.read_text()}")

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        self.popen.send_signal(sig)
        return self.popen.wait(timeout=STOP_WITHIN)


@contextlib.contextmanager
def koordlet(cmd: Sequence[str], args: Sequence[str], tmp_path: Path) -> Iterator[Proc]:
    """Start koordlet on a free loopback port and wait for ``/readyz``; always kill it after."""
    port = free_port()
    log = tmp_path / f"koordlet-{port}.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            # The state dir (audit log) stays in the test's tmp tree, never /var/lib/koordlet.
            [*cmd, "--addr", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state"), *args],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    proc = Proc(popen, f"http://127.0.0.1:{port}", log)
    try:
        proc.until("ready", lambda: proc.get("/readyz")[0] == 200)
        yield proc
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait(timeout=10)


def fake_args(fake: FakeHost, *extra: str) -> list[str]:
    return [
        "--standalone",
        "--cgroup-root-dir",
        fake.paths.cgroup_root,
        "--proc-root-dir",
        fake.paths.proc_root,
        "--sys-root-dir",
        fake.paths.sys_root,
        "--cgroup-version",
        str(fake.version),
        "--cgroup-driver",
        str(fake.layout.driver),
        "--collect-res-used-interval-seconds",
        "200ms",
        "--node-name",
        "fake-node",
        *extra,
    ]


def write_nodeslo(path: Path, apps: list[dict[str, Any]]) -> None:
    path.write_text(yaml.safe_dump({"spec": {"hostApplications": apps}}))


@pytest.mark.parametrize(
    ("version", "driver", "sig"),
    [
        (CgroupVersion.V1, CgroupDriver.CGROUPFS, signal.SIGTERM),
        (CgroupVersion.V2, CgroupDriver.SYSTEMD, signal.SIGINT),
    ],
    ids=["v1-cgroupfs-sigterm", "v2-systemd-sigint"],
)
def test_koordlet_on_a_fake_tree_serves_its_numbers_and_stops_cleanly(
    command: list[str],
    tmp_path: Path,
    host_root: Path,
    version: CgroupVersion,
    driver: CgroupDriver,
    sig: signal.Signals,
) -> None:
    fake = FakeHost(host_root, version, driver)
    pod_rel, (ctr_rel,) = fake.add_pod(UID, KubeQOS.BESTEFFORT, [("containerd", container_id(7))])
    fake.set_memory(pod_rel, anon=256 << 20, file=64 << 20)
    fake.set_memory(ctr_rel, anon=256 << 20, file=64 << 20)
    fake.add_host_app_cgroup("host-latency-sensitive/nginx")
    slo = tmp_path / "nodeslo.yaml"
    write_nodeslo(slo, [{"name": "nginx", "qos": "LS"}])
    mem = fake.meminfo

    with koordlet(command, fake_args(fake, "--nodeslo-file", str(slo)), tmp_path) as proc:

        def node_cpu() -> Samples | None:
            got = proc.samples()
            return got if one_value(got, "koordlet_node_used_cpu_cores") is not None else None

        samples = proc.until("node CPU exported", node_cpu)
        workloads = proc.json("/debug/workloads")
        capabilities = proc.json("/debug/capabilities")
        config = proc.json("/debug/config")
        code = proc.stop(sig)

    assert code == 0
    # /proc/stat does not move in the fake tree: no busy time between two ticks.
    assert one_value(samples, "koordlet_node_used_cpu_cores", node="fake-node") == 0.0
    used = (mem["MemTotal"] - mem["MemAvailable"]) * 1024
    assert one_value(samples, "koordlet_node_used_memory_bytes", node="fake-node") == used
    assert one_value(samples, "koordlet_pod_used_memory_bytes", pod_uid=UID) == 256 << 20
    assert one_value(samples, "koordlet_ready") == 1.0

    (pod,) = workloads["pods"]
    assert (pod["uid"], pod["qos"], pod["kube_qos"]) == (UID, "BE", "BestEffort")
    assert pod["cgroup_dir"] == pod_rel
    assert [c["cgroup_dir"] for c in pod["containers"]] == [ctr_rel]
    (app,) = workloads["host_apps"]
    assert (app["name"], app["cgroup_dir"], app["present"]) == (
        "nginx",
        "host-latency-sensitive/nginx",
        True,
    )
    assert capabilities["memory_stat"]["supported"] is True
    assert config["paths"]["cgroupRootDir"] == fake.paths.cgroup_root
    assert config["cgroup"]["driver"] == str(driver)
    assert "stage executor stopped" in proc.log.read_text()


def test_sighup_rereads_the_nodeslo_file(
    command: list[str], tmp_path: Path, host_root: Path
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    slo = tmp_path / "nodeslo.yaml"
    write_nodeslo(slo, [{"name": "aa", "qos": "LS"}])
    st = slo.stat()

    with koordlet(command, fake_args(fake, "--nodeslo-file", str(slo)), tmp_path) as proc:
        assert [a["name"] for a in proc.json("/debug/workloads")["host_apps"]] == ["aa"]
        write_nodeslo(slo, [{"name": "bb", "qos": "LS"}])  # same size and inode
        os.utime(slo, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the old time: unnoticed
        proc.popen.send_signal(signal.SIGHUP)

        def renamed() -> bool:
            return [a["name"] for a in proc.json("/debug/workloads")["host_apps"]] == ["bb"]

        proc.until("reload on SIGHUP", renamed)
        assert proc.stop() == 0


def test_a_bad_section_on_sighup_keeps_its_last_good_value_and_says_so(
    command: list[str], tmp_path: Path, host_root: Path
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    slo = tmp_path / "nodeslo.yaml"

    def write(burst_policy: str, threshold: int) -> None:
        spec = {
            "resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": threshold},
            "cpuBurstStrategy": {"policy": burst_policy},
        }
        slo.write_text(yaml.safe_dump({"spec": spec}))

    write("auto", 60)
    with koordlet(command, fake_args(fake, "--nodeslo-file", str(slo)), tmp_path) as proc:
        first = proc.json("/debug/qos")["nodeslo"]
        assert first["sections"]["cpuBurstStrategy"] == {"status": "ok"}
        write("sometimes", 55)
        proc.popen.send_signal(signal.SIGHUP)

        def rejected() -> bool:
            sections = proc.json("/debug/qos")["nodeslo"]["sections"]
            return sections["cpuBurstStrategy"]["status"] == "rejected"

        proc.until("the bad section rejected on SIGHUP", rejected)
        now = proc.json("/debug/qos")["nodeslo"]
        assert now["sections"]["cpuBurstStrategy"]["field"] == "spec.cpuBurstStrategy.policy"
        assert now["sections"]["resourceUsedThresholdWithBE"] == {"status": "ok"}  # applied
        assert now["generation"] == first["generation"] + 1
        _, metrics = proc.get("/metrics")
        assert 'koordlet_nodeslo_section_rejected{section="cpuBurstStrategy"} 1.0' in metrics
        assert "koordlet_nodeslo_reload_errors_total 1.0" in metrics
        assert proc.stop() == 0
    assert "spec.cpuBurstStrategy.policy" in proc.log.read_text()


def test_koordlet_on_this_machine_reports_its_real_memory(
    command: list[str], tmp_path: Path
) -> None:
    with koordlet(command, ["--standalone", "--nodeslo-file", ""], tmp_path) as proc:

        def both() -> tuple[float, float] | None:
            got = proc.samples()
            cpu = one_value(got, "koordlet_node_used_cpu_cores")
            memory = one_value(got, "koordlet_node_used_memory_bytes")
            return None if cpu is None or memory is None else (cpu, memory)

        cpu, memory = proc.until("node usage exported", both)
        meminfo = {
            line.split(":")[0]: int(line.split()[1]) * 1024
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.endswith("kB")
        }
        capabilities = proc.json("/debug/capabilities")
        assert proc.stop() == 0

    assert memory == pytest.approx(meminfo["MemTotal"] - meminfo["MemAvailable"], rel=0.05)
    # Busy jiffies over wall seconds between two ticks: the tick's timestamp is taken before
    # its worker thread reads /proc/stat, so on a saturated machine the value can pass the CPU
    # count by the scheduling delay (seen: 2.04 of 2). A quarter of slack bounds that.
    assert 0.0 <= cpu <= 1.25 * (os.cpu_count() or 1)
    assert capabilities["proc_stat"]["supported"] is True


def run_to_exit(cmd: Sequence[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*cmd, *args], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )


def test_a_broken_config_file_exits_2_naming_file_and_field(
    command: list[str], tmp_path: Path
) -> None:
    config = tmp_path / "koordlet.yaml"
    config.write_text("collect:\n  resUsedInterval: -1s\n")

    done = run_to_exit(command, "--config", str(config), "--addr", f"127.0.0.1:{free_port()}")

    assert done.returncode == 2
    assert str(config) in done.stderr
    assert "collect.resUsedInterval" in done.stderr


def test_a_broken_nodeslo_file_exits_2_naming_file_and_field(
    command: list[str], tmp_path: Path
) -> None:
    slo = tmp_path / "nodeslo.yaml"
    write_nodeslo(slo, [{"name": "x", "qos": "GOLD"}])

    done = run_to_exit(command, "--standalone", "--nodeslo-file", str(slo))

    assert done.returncode == 2
    assert str(slo) in done.stderr
    assert "hostApplications[0].qos" in done.stderr


@pytest.mark.parametrize(
    ("section", "value", "field"),
    [
        ("resourceUsedThresholdWithBE", {"cpuSuppressThresholdPercent": -5},
         "spec.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent"),
        ("resourceUsedThresholdWithBE", {"memoryEvictThresholdPercent": 101},
         "spec.resourceUsedThresholdWithBE.memoryEvictThresholdPercent"),
        ("cpuBurstStrategy", {"cpuBurstPercent": "lots"}, "spec.cpuBurstStrategy.cpuBurstPercent"),
        ("resourceUsedThresholdWithBE", {"cpuSuppressPolicy": "sometimes"},
         "spec.resourceUsedThresholdWithBE.cpuSuppressPolicy"),
    ],
    ids=["negative", "over-100", "string-for-number", "unknown-policy"],
)  # fmt: skip
def test_a_bad_strategy_value_in_the_nodeslo_file_exits_2_from_the_console_script(
    tmp_path: Path, section: str, value: dict[str, object], field: str
) -> None:
    """README's promise, through the installed ``koordlet`` entry point: a bad value is not
    started on with every strategy off, it stops the start naming the file and the field."""
    if not SCRIPT.exists():
        pytest.skip(f"the console script is not installed ({SCRIPT}); pip install -e . adds it")
    slo = tmp_path / "nodeslo.yaml"
    doc = {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "spec": {section: value}}
    slo.write_text(yaml.safe_dump(doc))

    done = run_to_exit(launcher(script=True), "--standalone", "--nodeslo-file", str(slo))

    assert done.returncode == 2, done.stderr
    assert f"koordlet: {slo}: {field}: " in done.stderr


@pytest.mark.parametrize("script", [False, True], ids=["python-m", "console-script"])
def test_version_and_help_print_and_exit_0(script: bool) -> None:
    if script and not SCRIPT.exists():
        pytest.skip(f"the console script is not installed ({SCRIPT}); pip install -e . adds it")
    command = launcher(script)

    version = run_to_exit(command, "--version")
    help_ = run_to_exit(command, "--help")

    assert version.returncode == 0
    assert version.stdout.startswith("koordlet (koordinator-py) ")
    assert help_.returncode == 0
    assert "--cgroup-root-dir" in help_.stdout
    assert "--feature-gates" in help_.stdout
    commands = help_.stdout.split("commands (koordlet COMMAND --help", 1)[1]
    assert re.search(r"^  host-app  start a host application", commands, re.MULTILINE)
    assert re.search(r"^  status    summarize the running koordlet", commands, re.MULTILINE)
    assert "koordlet {host-app,status,reset} ..." in help_.stdout  # the usage line names them too
