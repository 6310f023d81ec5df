"""What a new user sees when the koordlet cannot start: one line naming the flag or file, exit 2.

Each case runs the console script (``koordlet``, else ``python -m koordlet``) as a user would:
``--addr`` on a port another process holds, a ``--cgroup-root-dir`` that does not exist, no
kubeconfig outside a cluster without ``--standalone``, and an unknown flag. The traceback appears
only with ``-v``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from tests.fakehost import FakeHost

pytestmark = pytest.mark.daemon

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "koordlet"


def koordlet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd: Sequence[str] = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "koordlet"]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "KUBECONFIG"))}
    return subprocess.run(
        [*cmd, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**base, **(env or {})},
    )


def last_line(done: subprocess.CompletedProcess[str]) -> str:
    return done.stderr.strip().splitlines()[-1]


@pytest.fixture
def host_flags(host_root: Path, tmp_path: Path) -> list[str]:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    return [
        "--cgroup-root-dir", fake.paths.cgroup_root, "--proc-root-dir", fake.paths.proc_root,
        "--sys-root-dir", fake.paths.sys_root, "--cgroup-version", "v1",
        "--cgroup-driver", "cgroupfs", "--state-dir", str(tmp_path / "state"),
        "--nodeslo-file", "", "--runtime-hooks-addr", "",
    ]  # fmt: skip


def test_a_busy_addr_is_one_line_naming_the_flag(host_flags: list[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = koordlet("--standalone", *host_flags, "--addr", f"127.0.0.1:{port}")

    assert done.returncode == 2, done.stderr
    assert last_line(done) == (
        f"koordlet: --addr: cannot listen on 127.0.0.1:{port}: address already in use"
    )
    assert "Traceback" not in done.stderr


def test_a_missing_cgroup_root_is_one_line_naming_the_flag_and_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-cgroup"
    done = koordlet("--standalone", "--cgroup-root-dir", str(missing), "--state-dir", str(tmp_path))

    assert done.returncode == 2, done.stderr
    assert last_line(done).startswith(f"koordlet: --cgroup-root-dir: {missing}: no such directory")
    assert "Traceback" not in done.stderr


def test_no_kubeconfig_outside_a_cluster_says_to_pass_standalone(host_flags: list[str]) -> None:
    flags = [*host_flags[:-4], "--runtime-hooks-addr", ""]  # no --nodeslo-file without standalone
    done = koordlet(*flags, "--addr", "127.0.0.1:0", "--node-name", "n1")

    assert done.returncode == 2, done.stderr
    line = last_line(done)
    assert line.startswith("koordlet: --kubeconfig: ")
    assert "pass --kubeconfig FILE, or --standalone to run without Kubernetes" in line
    assert "Traceback" not in done.stderr


def test_a_kubeconfig_that_does_not_exist_is_named(host_flags: list[str], tmp_path: Path) -> None:
    flags = [*host_flags[:-4], "--runtime-hooks-addr", ""]
    missing = tmp_path / "kubeconfig"
    done = koordlet(*flags, "--addr", "127.0.0.1:0", "--kubeconfig", str(missing))

    assert done.returncode == 2, done.stderr
    assert last_line(done) == f"koordlet: --kubeconfig: {missing}: no such file"


def test_verbose_shows_the_traceback_after_the_same_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-cgroup"
    done = koordlet(
        "-v", "--standalone", "--cgroup-root-dir", str(missing), "--state-dir", str(tmp_path)
    )

    assert done.returncode == 2
    assert last_line(done).startswith("koordlet: --cgroup-root-dir: ")
    assert "Traceback" in done.stderr


def test_an_unknown_flag_suggests_the_closest_one() -> None:
    done = koordlet("--standalone", "--adr=127.0.0.1:1")

    assert done.returncode == 2
    assert last_line(done) == (
        "koordlet: command line: unrecognized arguments: --adr=127.0.0.1:1 (did you mean --addr?)"
    )
