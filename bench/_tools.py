"""External programs the HTTP benchmarks drive: Debian's ``wrk`` and ``prometheus-node-exporter``.

:func:`ensure_program` finds a program on ``PATH`` and, when it is missing, installs its Debian
package with ``apt-get`` (the benchmarks run as root on Debian; elsewhere it says what to
install). :func:`process_cpu` reads a process's CPU time, as the benchmarks compare processes.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from koordlet.system.paths import HostPaths

CLK_TCK = os.sysconf("SC_CLK_TCK")
PROC = HostPaths()
"""This machine's procfs."""
APT_TIMEOUT = 600.0


def ensure_program(program: str, package: str) -> str:
    """The path of ``program``; installs Debian's ``package`` first when it is missing."""
    found = shutil.which(program)
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        raise SystemExit(f"{program} is missing: install the Debian package {package} (as root)")
    print(f"bench: installing {package} with apt-get", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "--no-install-recommends", package]
    done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT)
    if done.returncode != 0:  # a stale package list: refresh it once and retry
        subprocess.run([apt, "update"], env=env, capture_output=True, timeout=APT_TIMEOUT)
        done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT)
    if done.returncode != 0:
        raise SystemExit(f"apt-get install {package} failed:\n{done.stderr[-2000:]}")
    found = shutil.which(program)
    if not found:
        raise SystemExit(f"{package} is installed but {program} is not on PATH")
    return found


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) the process has used, from ``/proc/<pid>/stat``; ``comm``
    may hold spaces and parentheses, so the fields are counted from the last ``)`` (proc(5):
    utime and stime are fields 14 and 15)."""
    with open(PROC.proc(str(pid), "stat"), "rb") as f:
        text = f.read()
    fields = text[text.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK
