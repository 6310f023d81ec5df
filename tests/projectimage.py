"""The project's container image for tests: ``packaging/image.py`` run once per session into a
temporary folder (its Debian base and dependency layer come from the shared cache, so only the
first build on a machine takes about a minute), or ``KOORDPY_IMAGE=/path/to.oci.tar`` to use an
archive built before. The ``project_image`` fixture (tests/conftest.py) hands it out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "packaging" / "image.py"
BUILD_TIMEOUT = 900
"""Seconds a build may take: a cold one runs mmdebstrap and pip wheel (about a minute here)."""


def why_not() -> str | None:
    """Why the image cannot be built here (one line); None when it can."""
    if os.environ.get("KOORDPY_IMAGE"):
        return None
    if os.geteuid() != 0:
        return "building the image needs root (mmdebstrap, chroot)"
    if shutil.which("mmdebstrap") is None:
        return "mmdebstrap not installed (Debian's mmdebstrap; scripts/dev.sh test installs it)"
    if not (REPO / ".venv" / "bin" / "python").is_file():
        return "no .venv/bin/python to build the wheels (scripts/dev.sh setup)"
    return None


@dataclass(frozen=True)
class Built:
    archive: Path
    ref: str
    summary: dict[str, Any] = field(default_factory=dict)
    """packaging/image.py's JSON line (empty for a given KOORDPY_IMAGE)."""


def build(out: Path, *args: str) -> Built:
    """``packaging/image.py --out out/koordinator-py.oci.tar ARGS``; raises with its stderr."""
    archive = out / "koordinator-py.oci.tar"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(archive), *args],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"packaging/image.py failed ({done.returncode}):\n{done.stderr[-4000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return Built(archive, summary["ref"], summary)


def given() -> Built | None:
    """The archive of ``KOORDPY_IMAGE``, named by its index."""
    path = os.environ.get("KOORDPY_IMAGE")
    if not path:
        return None
    import tarfile

    with tarfile.open(path) as t:
        f = t.extractfile("index.json")
        assert f is not None
        (entry,) = json.load(f)["manifests"]
    return Built(Path(path), entry["annotations"]["io.containerd.image.name"])
