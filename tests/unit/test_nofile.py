"""The daemon's open-file limit, raised in a fresh process started with a low one."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 4096))
    from koordlet.daemon import raise_nofile_limit
    from koordlet.system.paths import HostPaths

    after = raise_nofile_limit(HostPaths(proc_root=sys.argv[1]))
    print(*after, *resource.getrlimit(resource.RLIMIT_NOFILE))
    """
)


def limits_after(proc_root: str) -> list[int]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, proc_root], capture_output=True, text=True, check=True
    )
    return [int(v) for v in done.stdout.split()]


def has_cap_sys_resource() -> bool:
    with open("/proc/self/status") as f:
        caps = next(line for line in f if line.startswith("CapEff:"))
    return bool(int(caps.split()[1], 16) >> 24 & 1)  # CAP_SYS_RESOURCE is capability 24


@pytest.mark.skipif(not has_cap_sys_resource(), reason="raising the hard limit needs it")
def test_a_privileged_daemon_raises_its_hard_limit_up_to_the_kernels_ceiling(
    tmp_path: Path,
) -> None:
    proc = tmp_path / "proc"
    (proc / "sys" / "fs").mkdir(parents=True)
    (proc / "sys" / "fs" / "nr_open").write_text("65536\n")  # the ceiling caps the target

    assert limits_after(str(proc)) == [65536, 65536, 65536, 65536]


def test_without_privilege_the_soft_limit_goes_up_to_the_hard_one() -> None:
    if has_cap_sys_resource():
        # Drop CAP_SYS_RESOURCE for the child: setpriv is util-linux's.
        setpriv = "/usr/bin/setpriv"
        if not os.path.exists(setpriv):
            pytest.skip("setpriv is needed to run the child without CAP_SYS_RESOURCE")
        done = subprocess.run(
            [setpriv, "--inh-caps=-sys_resource", "--bounding-set=-sys_resource",
             sys.executable, "-c", SCRIPT, "/proc"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        values = [int(v) for v in done.stdout.split()]
    else:
        values = limits_after("/proc")
    assert values == [4096, 4096, 4096, 4096]


@pytest.mark.parametrize(
    ("soft", "kept"),
    [(1024, 512), (2048, 1024), (4096, 3072), (20_000, 15_000)],
)
def test_three_quarters_of_the_soft_limit_are_kept_open_leaving_at_least_1024(
    soft: int, kept: int
) -> None:
    script = (
        "import resource, sys\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), hard))\n"
        "from koordlet.system.openfiles import default_limit\n"
        "print(default_limit())\n"
    )
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < soft:
        pytest.skip(f"the hard limit here is {hard}")
    done = subprocess.run(
        [sys.executable, "-c", script, str(soft)], capture_output=True, text=True, check=True
    )
    assert int(done.stdout) == kept
