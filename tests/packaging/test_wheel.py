"""The project's wheel (what the .deb, the .rpm and the image install) carries the data its code
reads at run time, not only the code: the CRDs the manager validates NodeSLOs against, and the
/debug/ui page. An install without them failed only once the manager ran in a pod
(``apis.slo.SchemaError: .../packaging/kubernetes/crds: no CRD files``). Where a C compiler is,
it carries the koordlet's native column reader too (``koordlet.system.nativeread``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_carries_the_crds_and_the_ui_page(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("koordinator_py-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        crds = sorted(n for n in names if n.startswith("apis/crds/"))
        ours = sorted(p.name for p in (REPO / "packaging" / "kubernetes" / "crds").glob("*.yaml"))
        assert [n.removeprefix("apis/crds/") for n in crds] == ours
        for name in ours:
            shipped = (REPO / "packaging" / "kubernetes" / "crds" / name).read_bytes()
            assert z.read(f"apis/crds/{name}") == shipped
        assert "koordlet/server/ui.html" in names
        if shutil.which("cc") or shutil.which("gcc"):  # setup.py's optional native reader
            assert "koordlet/system/_colread.so.1" in names, sorted(names)
