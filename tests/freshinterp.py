"""Run a script in a fresh interpreter from the repository's root (module imports are
process-wide, so checks of what an import or a start loads cannot run in the test process)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_json(script: str, *, timeout: float = 60) -> Any:
    """Run ``script`` (dedented) with this interpreter; its last line of output, as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
