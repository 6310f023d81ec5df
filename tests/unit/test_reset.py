"""``koordlet reset`` on fake trees (cgroup v2, which this machine cannot mount; and v1): what the
daemon's writers recorded is put back, through the writers, audited; ``--dry-run`` writes
nothing; the best-effort QoS cgroup is reset even without a journal; a koordlet still answering
is refused. The real cgroup v1 hierarchy is in ``tests/integration/test_reset_realcgroup.py``."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from apis.extension import KubeQOS
from koordlet import reset as reset_cmd
from koordlet.config import KoordletConfig, load_config
from koordlet.executor.originals import OriginalsJournal, read_boot_id
from koordlet.executor.resctrl import ResctrlWriter
from koordlet.executor.sysctl import MIN_FREE_KBYTES, SystemFileWriter
from koordlet.executor.writer import CgroupWriter
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from koordlet.system.knobs import CPU_CFS_QUOTA, CPU_SHARES, CPUSET_CPUS, MEMORY_MIN
from tests.daemon import free_port
from tests.fakehost import FakeHost

BOOT = "1c8f7a42-2222-4d5e-8f90-000000000002"
UID = "5b0e4c1a-0000-4d2d-9e9e-00000000beef"


def make(
    host_root: Path, tmp_path: Path, version: CgroupVersion
) -> tuple[FakeHost, KoordletConfig]:
    fake = FakeHost(host_root, version, CgroupDriver.SYSTEMD)
    proc = Path(fake.paths.proc_root)
    (proc / "sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (proc / "sys/kernel/random/boot_id").write_text(BOOT + "\n")
    (proc / "sys/vm").mkdir(parents=True, exist_ok=True)
    (proc / "sys/vm/min_free_kbytes").write_text("67584\n")
    (Path(fake.paths.sys_root) / "fs/resctrl").mkdir(parents=True, exist_ok=True)
    cfg = load_config(
        [
            "--standalone", "--nodeslo-file", "",
            "--cgroup-root-dir", fake.paths.cgroup_root, "--proc-root-dir", fake.paths.proc_root,
            "--sys-root-dir", fake.paths.sys_root, "--cgroup-version", str(version),
            "--cgroup-driver", "systemd", "--state-dir", str(tmp_path / "state"),
            "--addr", f"127.0.0.1:{free_port()}",
        ]
    )  # fmt: skip
    return fake, cfg


def run_daemon_writes(fake: FakeHost, cfg: KoordletConfig) -> dict[str, str]:
    """What the daemon's strategies would have written, through writers with the journal; the
    paths written → the text they held before."""
    journal = OriginalsJournal(cfg.state_dir, boot_id=read_boot_id(cfg.paths.proc_root)).load()
    writer = CgroupWriter(fake.host, record_original=journal.record)
    be = fake.layout.qos_dir(KubeQOS.BESTEFFORT)
    pod, _ = fake.add_pod(UID, KubeQOS.BESTEFFORT, [("containerd", "c" * 64)])
    before = {}
    for knob, rel, value in (
        (CPU_CFS_QUOTA, be, 2000),  # cpusuppress, cfsQuota policy
        (CPUSET_CPUS, be, "0"),  # cpusuppress, cpuset policy
        (CPU_SHARES, pod, 1024),  # the BatchResource hook
        (MEMORY_MIN, pod, 1 << 20),  # cgreconcile
    ):
        if knob is MEMORY_MIN and fake.version is CgroupVersion.V1:
            continue  # Anolis only on v1
        filename = knob.file_for(fake.version)
        assert filename is not None
        path = fake.layout.file(knob.controller, rel, filename)
        before[path] = Path(path).read_text().strip()
        writer.write(knob, rel, value, strategy="test")  # type: ignore[arg-type]
    sysfiles = SystemFileWriter(fake.paths, record_original=journal.record)
    sysfiles.write(MIN_FREE_KBYTES, 90000, strategy="sysreconcile")
    ResctrlWriter(fake.paths, record_original=journal.record).ensure_group("BE")
    return before


def rd(fake: FakeHost, controller: str, rel: str, filename: str) -> str:
    return fake.read(controller, rel, filename).strip()


def audit(cfg: KoordletConfig) -> list[dict[str, object]]:
    path = Path(cfg.audit_dir) / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("version", list(CgroupVersion))
def test_a_dry_run_prints_what_it_would_write_and_writes_nothing(
    host_root: Path, tmp_path: Path, version: CgroupVersion
) -> None:
    fake, cfg = make(host_root, tmp_path, version)
    run_daemon_writes(fake, cfg)
    be = fake.layout.qos_dir(KubeQOS.BESTEFFORT)
    quota_file = Path(fake.layout.file("cpu", be, CPU_CFS_QUOTA.file_for(version) or ""))
    throttled = quota_file.read_text()
    out = io.StringIO()

    code = reset_cmd.reset(cfg, dry_run=True, out=out)

    assert code == 0
    assert quota_file.read_text() == throttled
    lines = out.getvalue().splitlines()
    assert any(ln.startswith("would ") and str(quota_file) in ln for ln in lines)
    assert lines[-1].startswith("koordlet reset: would write ")
    assert (Path(fake.paths.sys_root) / "fs/resctrl/BE").is_dir()
    assert {e["kind"] for e in audit(cfg) if e["strategy"] == "reset"} == {"decision"}
    assert len(OriginalsJournal(cfg.state_dir, boot_id=BOOT).load()) == 6 - (
        version is CgroupVersion.V1
    )


@pytest.mark.parametrize("version", list(CgroupVersion))
def test_reset_puts_back_what_was_written_and_audits_it(
    host_root: Path, tmp_path: Path, version: CgroupVersion
) -> None:
    fake, cfg = make(host_root, tmp_path, version)
    before = run_daemon_writes(fake, cfg)
    be = fake.layout.qos_dir(KubeQOS.BESTEFFORT)
    kube = fake.layout.kube_root

    code = reset_cmd.reset(cfg, dry_run=False, out=io.StringIO())

    assert code == 0
    quota = rd(fake, "cpu", be, "cpu.cfs_quota_us" if version is CgroupVersion.V1 else "cpu.max")
    assert quota == ("-1" if version is CgroupVersion.V1 else "max 100000")
    cpus = rd(fake, "cpuset", be, "cpuset.cpus")
    assert cpus == rd(fake, "cpuset", kube, "cpuset.cpus")  # the parent's
    for path, text in before.items():
        if "cpu.max" in path or "cfs_quota" in path or "cpuset.cpus" in path:
            continue
        assert Path(path).read_text().strip() == text, path  # the pod's, as found
    assert (Path(fake.paths.proc_root) / "sys/vm/min_free_kbytes").read_text().strip() == "67584"
    assert not (Path(fake.paths.sys_root) / "fs/resctrl/BE").exists()
    written = [e for e in audit(cfg) if e["strategy"] == "reset"]
    assert {e["kind"] for e in written} == {"write"}
    assert any(e["knob"] == "vm.min_free_kbytes" and e["new"] == "67584" for e in written)
    assert len(OriginalsJournal(cfg.state_dir, boot_id=BOOT).load()) == 0
    # again: nothing left to do
    out = io.StringIO()
    assert reset_cmd.reset(cfg, dry_run=False, out=out) == 0
    assert "wrote 0 of" in out.getvalue().splitlines()[-1]


def test_the_best_effort_cgroup_is_reset_without_a_journal(host_root: Path, tmp_path: Path) -> None:
    """A koordlet of an older version (or Koordinator's) left the BE quota at 2000 us."""
    fake, cfg = make(host_root, tmp_path, CgroupVersion.V2)
    be = fake.layout.qos_dir(KubeQOS.BESTEFFORT)
    fake.write("cpu", be, "cpu.max", "2000 100000\n")
    fake.write("cpuset", be, "cpuset.cpus", "0\n")

    assert reset_cmd.reset(cfg, dry_run=False, out=io.StringIO()) == 0

    assert rd(fake, "cpu", be, "cpu.max") == "max 100000"
    assert rd(fake, "cpuset", be, "cpuset.cpus") == rd(
        fake, "cpuset", fake.layout.kube_root, "cpuset.cpus"
    )


def test_a_removed_pods_values_are_skipped(host_root: Path, tmp_path: Path) -> None:
    fake, cfg = make(host_root, tmp_path, CgroupVersion.V2)
    run_daemon_writes(fake, cfg)
    fake.remove_cgroup(fake.layout.pod_dir(KubeQOS.BESTEFFORT, UID))
    out = io.StringIO()

    assert reset_cmd.reset(cfg, dry_run=False, out=out) == 0

    assert sum("cgroup gone" in ln for ln in out.getvalue().splitlines()) == 2


class _Healthz(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def koordlet_answering() -> Iterator[int]:
    server = HTTPServer(("127.0.0.1", 0), _Healthz)
    thread = threading.Thread(target=server.serve_forever, name="fake-koordlet", daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_koordlet_still_answering_is_refused(
    host_root: Path, tmp_path: Path, koordlet_answering: int, capsys: pytest.CaptureFixture[str]
) -> None:
    fake, _ = make(host_root, tmp_path, CgroupVersion.V2)
    be = fake.layout.qos_dir(KubeQOS.BESTEFFORT)
    fake.write("cpu", be, "cpu.max", "2000 100000\n")
    args = [
        "--standalone", "--nodeslo-file", "", "--cgroup-root-dir", fake.paths.cgroup_root,
        "--proc-root-dir", fake.paths.proc_root, "--state-dir", str(tmp_path / "state"),
        "--addr", f"127.0.0.1:{koordlet_answering}",
    ]  # fmt: skip

    assert reset_cmd.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"koordlet: --addr: a koordlet answers at http://127.0.0.1:{koordlet_answering}/healthz"
    )
    assert rd(fake, "cpu", be, "cpu.max") == "2000 100000"  # untouched

    assert reset_cmd.main(["--force", *args]) == 0
    assert rd(fake, "cpu", be, "cpu.max") == "max 100000"


def test_a_missing_cgroup_root_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = reset_cmd.main(
        ["--standalone", "--cgroup-root-dir", str(tmp_path / "none"), "--state-dir", str(tmp_path),
         "--addr", f"127.0.0.1:{free_port()}"]
    )  # fmt: skip
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        f"koordlet: --cgroup-root-dir: {tmp_path / 'none'}: no such directory "
        "(the host's cgroup mount, usually /sys/fs/cgroup)"
    )
