"""The .deb and .rpm that ``make packages`` builds: contents, configuration files, maintainer
scripts, an installation into a clean root with the real dpkg, removal and purge.

The installation uses ``dpkg --root`` with ``--force-script-chrootless``: the maintainer scripts
run here with ``DPKG_ROOT`` set to the temporary root and must touch nothing outside it; the test
checks that too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from apis.extension import KubeQOS
from koordlet import __version__
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from tests.fakehost import FakeHost
from tests.packaging.conftest import Built

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CONFFILES = ("/etc/koordinator/koordlet.yaml", "/etc/koordinator/nodeslo.yaml")
UNITS = (
    "koordlet.service",
    "koordlet.slice",
    "host-latency-sensitive.slice",
    "host-best-effort.slice",
)
HOST_PATHS = ("/opt/koordinator", "/var/lib/koordlet", "/etc/koordinator", "/usr/bin/koordlet")
"""What the package installs on a real host: the chrootless scripts must leave these alone."""


def run(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{' '.join(cmd)}: {done.stderr}"
    return done.stdout


def tree(root: Path) -> set[str]:
    """Every path below ``root`` except dpkg's database."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == "var/lib/dpkg" or rel.startswith("var/lib/dpkg/"):
            dirnames[:] = []
            continue
        out.update(os.path.normpath(os.path.join(rel, n)) for n in dirnames + filenames)
    return out


@pytest.fixture
def clean_root(tmp_path: Path) -> Iterator[Path]:
    """An empty root with a dpkg database, systemd's configuration folder and /opt, as a
    minimal Debian installation has them (base-files ships /opt)."""
    if shutil.which("dpkg") is None:
        pytest.skip("dpkg not found")
    root = tmp_path / "root"
    for d in ("var/lib/dpkg/info", "var/lib/dpkg/updates", "etc/systemd/system", "opt"):
        (root / d).mkdir(parents=True)
    for f in ("status", "available"):
        (root / "var/lib/dpkg" / f).touch()
    before = {p: os.path.lexists(p) for p in HOST_PATHS}
    yield root
    assert {p: os.path.lexists(p) for p in HOST_PATHS} == before, "the host was touched"


def dpkg(root: Path, *args: str) -> str:
    return run("dpkg", f"--root={root}", "--force-script-chrootless", *args)


def test_deb_lists_its_dependency_conffiles_units_and_launcher(built: Built) -> None:
    info = run("dpkg-deb", "-I", str(built.deb))
    files = {
        line.split()[5].lstrip(".") for line in run("dpkg-deb", "-c", str(built.deb)).splitlines()
    }

    assert "Package: koordinator-py" in info
    assert f"Version: {__version__}" in info
    assert "Depends: python3." in info
    assert run("dpkg-deb", "-f", str(built.deb), "Architecture").strip() == "amd64"
    for unit in UNITS:
        assert f"/lib/systemd/system/{unit}" in files
    assert "/usr/bin/koordlet" in files
    assert "/opt/koordinator/bin/koordlet" in files
    assert set(CONFFILES) <= files


def test_deb_marks_the_configuration_and_ships_its_maintainer_scripts(
    built: Built, tmp_path: Path
) -> None:
    run("dpkg-deb", "-e", str(built.deb), str(tmp_path))

    assert (tmp_path / "conffiles").read_text().split() == list(CONFFILES)
    postinst = (tmp_path / "postinst").read_text()
    assert "[ -d /run/systemd/system ]" in postinst
    assert "enable koordlet.service" in postinst
    prerm = (tmp_path / "prerm").read_text()
    assert "stop koordlet.service" in prerm
    # reset on removal only (not on upgrade), after the stop, never on a --root installation
    reset = prerm.index("koordlet reset --standalone --config /etc/koordinator/koordlet.yaml")
    assert prerm.index("stop koordlet.service") < reset
    assert '[ "$1" = remove ] && [ -z "$ROOT" ]' in prerm[:reset]
    postrm = (tmp_path / "postrm").read_text()
    purge = postrm.split("purge)", 1)[1].split(";;", 1)[0]
    for path in ("/var/lib/koordlet", "/etc/koordinator", "/opt/koordinator"):
        assert f'"$ROOT{path}"' in purge
    for script in ("postinst", "prerm", "postrm"):
        assert os.access(tmp_path / script, os.X_OK)
        run("sh", "-n", str(tmp_path / script))


def test_deb_installs_into_a_clean_root_where_koordlet_runs_and_the_service_is_enabled(
    built: Built, clean_root: Path
) -> None:
    dpkg(clean_root, "--force-depends", "-i", str(built.deb))

    launcher = clean_root / "usr/bin/koordlet"
    assert os.readlink(launcher) == "/opt/koordinator/bin/koordlet"
    venv = clean_root / "opt/koordinator"
    assert (venv / "bin/koordlet").read_text().splitlines()[0] == "#!/opt/koordinator/bin/python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH")}
    done = subprocess.run(
        [str(venv / "bin/python"), str(venv / "bin/koordlet"), "--version"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"koordlet (koordinator-py) {__version__}"
    wants = clean_root / "etc/systemd/system/multi-user.target.wants/koordlet.service"
    if shutil.which("systemctl"):
        assert os.readlink(wants) == "/lib/systemd/system/koordlet.service"
    assert oct((clean_root / "var/lib/koordlet").stat().st_mode & 0o777) == "0o750"


def test_the_installed_environment_imports_its_own_packages_not_the_repositorys(
    built: Built, clean_root: Path
) -> None:
    dpkg(clean_root, "--force-depends", "-i", str(built.deb))
    venv = clean_root / "opt/koordinator"

    out = run(
        str(venv / "bin/python"),
        "-I",
        "-c",
        "import sys, koordlet, uvloop, aiohttp, grpclib, yaml; "
        "print(sys.prefix); print(koordlet.__file__)",
    ).split()

    assert out[0] == str(venv)
    assert out[1].startswith(str(venv / "lib"))
    assert not (venv / "bin/pip").exists()


def test_removal_keeps_only_the_configuration_and_purge_leaves_nothing(
    built: Built, clean_root: Path
) -> None:
    before = tree(clean_root)
    dpkg(clean_root, "--force-depends", "-i", str(built.deb))
    stray = clean_root / "opt/koordinator/lib/stray.pyc"
    stray.write_bytes(b"written at run time")
    (clean_root / "var/lib/koordlet/audit.jsonl").write_text("{}\n")

    dpkg(clean_root, "-r", "koordinator-py")
    after_remove = tree(clean_root) - before

    assert after_remove == {
        "etc/koordinator",
        "etc/koordinator/koordlet.yaml",
        "etc/koordinator/nodeslo.yaml",
        "var/lib/koordlet",
        "var/lib/koordlet/audit.jsonl",
    }

    dpkg(clean_root, "-P", "koordinator-py")

    assert tree(clean_root) - before == set()


def test_rpm_lists_its_files_configuration_and_scripts(built: Built) -> None:
    if built.rpm is None:
        pytest.skip(built.why_no_rpm)
    if shutil.which("rpm") is None:
        pytest.skip("rpm not found (apt package rpm)")
    rpm = str(built.rpm)

    files = set(run("rpm", "-qp", "--list", rpm).split())
    configs = run("rpm", "-qp", "--configfiles", rpm).split()
    scripts = run("rpm", "-qp", "--scripts", rpm)
    requires = run("rpm", "-qp", "--requires", rpm)

    for unit in UNITS:
        assert f"/usr/lib/systemd/system/{unit}" in files
    assert {"/usr/bin/koordlet", "/opt/koordinator/bin/koordlet"} <= files
    assert sorted(configs) == sorted(CONFFILES)
    assert "[ -d /run/systemd/system ]" in scripts
    assert "systemctl enable koordlet.service" in scripts
    assert "systemctl stop koordlet.service" in scripts
    assert "rm -rf /opt/koordinator" in scripts
    preun = scripts.split("preuninstall scriptlet", 1)[1].split("scriptlet", 1)[0]
    assert 'if [ "$1" -eq 0 ]' in preun  # erase, not upgrade
    assert "/usr/bin/koordlet reset --standalone --config /etc/koordinator/koordlet.yaml" in preun
    assert "/usr/bin/python3." in requires
    assert run("rpm", "-qp", "--qf", "%{VERSION}", rpm) == __version__


def test_the_packaged_koordlet_resets_a_throttled_best_effort_cgroup(
    built: Built, clean_root: Path, tmp_path: Path
) -> None:
    """What the removal runs, from the installed environment: on a (fake, cgroup v2) host where
    a koordlet left the best-effort QoS cgroup at 2000 us, ``koordlet reset`` puts it back."""
    dpkg(clean_root, "--force-depends", "-i", str(built.deb))
    fake = FakeHost(tmp_path / "host", CgroupVersion.V2, CgroupDriver.SYSTEMD)
    be = fake.layout.qos_dir(KubeQOS.BESTEFFORT)
    fake.write("cpu", be, "cpu.max", "2000 100000\n")
    venv = clean_root / "opt/koordinator"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH")}
    flags = [
        "--standalone", "--nodeslo-file", "", "--cgroup-root-dir", fake.paths.cgroup_root,
        "--proc-root-dir", fake.paths.proc_root, "--sys-root-dir", fake.paths.sys_root,
        "--state-dir", str(tmp_path / "state"), "--addr", "127.0.0.1:1",
    ]  # fmt: skip

    done = subprocess.run(
        [str(venv / "bin/python"), str(venv / "bin/koordlet"), "reset", *flags],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr
    assert fake.read("cpu", be, "cpu.max").strip() == "max 100000"
    assert "koordlet reset: wrote " in done.stdout
