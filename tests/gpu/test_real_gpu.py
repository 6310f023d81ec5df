"""On a machine with a real NVIDIA GPU: ``scripts/gpu_check.sh`` against the real NVML (the
collector, the Device object, the ``koordlet_gpu_*`` samples; docs/devices.md). Skipped where
there is none. It runs in a child: this process may hold the fake library under NVML's name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.nvmlfake import ENV

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in (ENV, "LD_LIBRARY_PATH")}


def _real_nvml_present() -> bool:
    probe = "import ctypes; ctypes.CDLL('libnvidia-ml.so.1')"
    done = subprocess.run([sys.executable, "-c", probe], env=_clean_env(), capture_output=True)
    return done.returncode == 0


@pytest.mark.skipif(not _real_nvml_present(), reason="no NVIDIA driver (libnvidia-ml.so.1) here")
def test_the_gpu_check_holds_on_the_real_gpus() -> None:
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh"],
        cwd=REPO,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "all checks hold" in done.stdout
