"""The packages, built once per session by ``packaging/build.sh`` into a temporary ``dist``.

``KOORDPY_DIST=/path/to/dist`` reuses packages already built there (``make packages``) instead.
The tests that need them carry the ``slow`` marker: ``pytest -m "not slow"`` leaves them out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 600
"""Seconds the build may take (a cold pip cache downloads every dependency)."""
EXIT_NO_RPMBUILD = 3
"""``packaging/build.sh``: the .deb was built, rpmbuild is missing."""


@dataclass(frozen=True)
class Built:
    deb: Path
    rpm: Path | None
    """None when rpmbuild is missing here; :attr:`why_no_rpm` says so."""
    why_no_rpm: str = ""


def _version() -> str:
    import tomllib

    with open(REPO / "pyproject.toml", "rb") as f:
        return str(tomllib.load(f)["project"]["version"])


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    version = _version()
    given = os.environ.get("KOORDPY_DIST")
    if given:
        dist = Path(given)
    else:
        if shutil.which("dpkg-deb") is None:
            pytest.skip("dpkg-deb not found (apt package dpkg)")
        dist = tmp_path_factory.mktemp("dist")
        done = subprocess.run(
            [str(REPO / "packaging/build.sh")],
            env={**os.environ, "DIST": str(dist)},
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
        if done.returncode not in (0, EXIT_NO_RPMBUILD):
            pytest.fail(f"packaging/build.sh failed ({done.returncode}):\n{done.stderr[-4000:]}")
    deb = dist / f"koordinator-py_{version}_amd64.deb"
    rpm = dist / f"koordinator-py-{version}-1.x86_64.rpm"
    assert deb.is_file(), f"no {deb.name} in {dist}"
    if rpm.is_file():
        yield Built(deb, rpm)
    else:
        yield Built(deb, None, "rpmbuild not found (apt package rpm): no .rpm was built")
