"""Every binary's ``--help``, and each subcommand's, as a user runs the console script: plain
text, no reStructuredText markup leaking from a docstring (````double backticks````)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
COMMANDS = [
    ("koordlet",),
    ("koordlet", "status"),
    ("koordlet", "host-app"),
    ("koordlet", "host-app", "list"),
    ("koordlet", "host-app", "run"),
    ("koordlet", "reset"),
    ("koord-manager",),
    ("koord-manager", "run"),
    ("koord-manager", "explain"),
    ("koord-manager", "webhook"),
    ("koord-scheduler",),
    ("koord-scheduler", "explain"),
    ("koord-scheduler", "extender"),
    ("koord-scheduler", "run"),
    ("koord-descheduler",),
    ("koord-descheduler", "explain"),
    ("koord-descheduler", "run"),
    ("koord-runtime-proxy",),
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_is_plain_text_without_rst_markup(command: tuple[str, ...]) -> None:
    script = BIN / command[0]
    if not script.exists():
        pytest.skip(f"{script} is not installed (scripts/dev.sh setup installs it)")
    done = subprocess.run(
        [str(script), *command[1:], "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
    assert "``" not in done.stdout, done.stdout
    assert ":mod:" not in done.stdout
    assert ":class:" not in done.stdout
