"""``koord-manager`` as a user runs it: the console script's help lists every subcommand, and
``koord-manager run`` holds the Lease, writes, and on SIGTERM stops and releases the Lease."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from manager.cli import COMMANDS
from manager.runtime import LEASE_NAME
from tests.kubefake import FakeApiServer
from tests.manager.builders import node
from tests.manager.conftest import eventually

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "koord-manager"


def command() -> list[str]:
    if SCRIPT.exists():
        return [str(SCRIPT)]
    return [sys.executable, "-m", "manager.cli"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command(), *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def test_help_lists_every_subcommand() -> None:
    done = run("--help")
    assert done.returncode == 0
    for name in ("run", "explain", "webhook"):
        assert name in COMMANDS
    listed = re.findall(r"^    (\w+)\s", done.stdout, re.MULTILINE)
    assert listed == list(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_subcommand_has_its_own_help(name: str) -> None:
    done = run(name, "--help")
    assert done.returncode == 0
    assert f"usage: koord-manager {name}" in done.stdout


def test_no_or_an_unknown_subcommand_is_a_usage_error_naming_them() -> None:
    none, bogus = run(), run("bogus")
    assert (none.returncode, bogus.returncode) == (2, 2)
    assert "COMMAND" in none.stderr
    assert "invalid choice: 'bogus'" in bogus.stderr
    assert "run" in bogus.stderr
    assert "webhook" in bogus.stderr


async def test_run_holds_the_lease_and_on_sigterm_stops_and_releases_it(
    kube_api: FakeApiServer, kubeconfig: Path, tmp_path: Path
) -> None:
    kube_api.put("nodes", node("n1"))
    log = tmp_path / "manager.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *command(),
            "run",
            f"--kubeconfig={kubeconfig}",
            "--controllers=nodemetric",
            stdout=out,
            stderr=out,
            env={**os.environ, "POD_NAME": "m"},
            cwd=ROOT,
        )
    try:

        def holder() -> str:
            lease = kube_api.get("leases", LEASE_NAME, "koordinator-system") or {}
            return str((lease.get("spec") or {}).get("holderIdentity") or "")

        await eventually(lambda: holder().startswith("m_"), within=30)
        await eventually(lambda: kube_api.get("nodemetrics", "n1") is not None, within=30)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0, log.read_text()
        assert holder() == ""  # released on the way out
        assert "released lease" in log.read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
