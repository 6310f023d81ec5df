"""``scripts/dev.sh run`` says what it is about to do: a dry run, or a koordlet that writes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STAMP = REPO / ".venv" / ".lock-stamp"


STAMPED = ("requirements/lock.txt", "pyproject.toml", "setup.py", "koordlet/system/_colread.c")
"""What ``scripts/dev.sh setup`` writes to its stamp, in order (``sources`` there)."""


def _set_up() -> bool:
    """Whether ``scripts/dev.sh setup`` made this checkout's .venv as it stands: its stamp is
    the files of :data:`STAMPED`, one after the other."""
    want = b"".join((REPO / name).read_bytes() for name in STAMPED)
    return STAMP.is_file() and STAMP.read_bytes() == want


pytestmark = pytest.mark.skipif(
    not _set_up(),
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
