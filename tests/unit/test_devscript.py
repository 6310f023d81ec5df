"""``scripts/dev.sh run`` says what it is about to do: a dry run, or a koordlet that writes."""

from __future__ import annotations

import filecmp
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STAMP = REPO / ".venv" / ".lock-stamp"

pytestmark = pytest.mark.skipif(
    not (STAMP.is_file() and filecmp.cmp(STAMP, REPO / "requirements/lock.txt", shallow=False)),
    reason="scripts/dev.sh setup has not made this checkout's .venv (it would install it)",
)


def run(*args: str) -> str:
    done = subprocess.run(
        [str(REPO / "scripts/dev.sh"), "run", *args, "--version"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("koordlet (koordinator-py) ")
    return done.stderr


@pytest.mark.parametrize("args", [(), ("--dry-run=false", "--dry-run=true")])
def test_a_dry_run_says_nothing_is_written(args: tuple[str, ...]) -> None:
    err = run(*args)
    assert "dry run: QoS decisions are logged and audited, nothing is written" in err
    assert "NOT a dry run" not in err


@pytest.mark.parametrize("args", [("--dry-run", "false")])
def test_dry_run_false_says_it_writes(args: tuple[str, ...]) -> None:
    err = run(*args)
    assert "NOT a dry run: QoS strategies write cgroups" in err
    assert "nothing is written" not in err
