#!/usr/bin/env python3
"""Build koordinator-py's container image as an OCI image-layout tar, without Docker or a registry.

    python3 packaging/image.py --out DIR/koordinator-py.oci.tar [--ref REF]
    ctr -n k8s.io images import DIR/koordinator-py.oci.tar          # on each node

One image for every component (koordlet, koord-manager, koord-scheduler, koord-descheduler,
koord-runtime-proxy), with packaging/Dockerfile's entrypoint, environment and labels; the manifests
in packaging/kubernetes name it (docs/kubernetes.md, "Installing").

Three layers, the first two cached under ``--cache`` (default /var/cache/koordinator-py):

1. ``base``: a Debian root file system made by ``mmdebstrap`` from Debian's packages (Python 3
   and its standard library, venv, the C++ runtime, CA certificates, and openssl, with which the
   webhook makes its certificates), keyed by the suite, the apt sources, the package list,
   the recipe and ``SOURCE_DATE_EPOCH``; ``--refresh-base`` makes it again (Debian's security
   updates);
2. ``deps``: /opt/koordinator, a virtual environment made by the image's own interpreter inside
   that root file system (``chroot``), with every runtime dependency installed from wheels that
   pip built on this host, pinned by requirements/lock.txt (the host's pip configuration reaches
   the package index; nothing inside the chroot touches the network); keyed by the base, the lock
   and the dependency list;
3. the project: koordinator-py's own wheel installed into that environment (the files it adds).

Every layer is written deterministically (sorted, numeric owners, each mtime
``SOURCE_DATE_EPOCH`` or 0, byte code compiled as unchecked-hash .pyc files that do not depend on
the sources' mtimes) and uncompressed by default (containerd imports it without inflating;
``--gzip`` for an archive that travels): the same caches and sources give the same image digest,
and a changed source changes only the last, small layer.

Needs root (mmdebstrap's root mode, chroot) and Debian's mmdebstrap. Standard library only.
Prints a JSON summary on stdout. Remove ``base-*``, ``deps-*`` and ``wheels-*`` under the cache to
reclaim the space of older locks.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = Path("/var/cache/koordinator-py")
REGISTRY = "127.0.0.1:5999"
"""A loopback registry host: a pull of this image where it was not imported can only reach this
machine (where nothing serves it), never a public registry."""
REPOSITORY = f"{REGISTRY}/koordinator-py/koordinator"
PREFIX = "/opt/koordinator"
COMPONENTS = (
    "koordlet", "koord-manager", "koord-scheduler", "koord-descheduler", "koord-runtime-proxy",
)  # fmt: skip

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


def project() -> dict[str, Any]:
    with open(REPO / "pyproject.toml", "rb") as f:
        data: dict[str, Any] = tomllib.load(f)["project"]
    return data


def default_ref() -> str:
    return f"{REPOSITORY}:{project()['version']}"


# The image's configuration. packaging/Dockerfile's final stage declares the same (ENTRYPOINT,
# CMD, ENV, LABEL, EXPOSE, USER); tests/packaging/test_image.py holds the two in step.
ENTRYPOINT = [f"{PREFIX}/bin/koordlet"]
CMD = ["--addr=:9316", "--cgroup-root-dir=/host-cgroup", "--sys-root-dir=/host-sys"]
ENV = {
    "PATH": f"{PREFIX}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "LANG": "C.UTF-8",  # python:3.11-slim, the Dockerfile's base, sets it
}
EXPOSED_PORTS = ("9316/tcp",)


def labels(version: str) -> dict[str, str]:
    return {
        "org.opencontainers.image.title": "koordinator-py",
        "org.opencontainers.image.description": ", ".join(COMPONENTS),
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.version": version,
    }


class BuildError(Exception):
    """A step failed; the message names the step and what to do."""


def log(msg: str) -> None:
    print(f"==> {time.strftime('%T')} {msg}", file=sys.stderr, flush=True)


def run(args: Sequence[str], *, what: str, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(
        list(args), env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise BuildError(f"{what} failed ({proc.returncode}): {' '.join(args)}\n{tail}")


def chroot_run(root: Path, args: Sequence[str], *, what: str) -> None:
    """``args`` inside ``root`` in a clean environment: nothing of the host's, no index for pip."""
    env = {
        "PATH": f"{PREFIX}/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/root",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",  # the same byte code every time
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_CACHE_DIR": "1",
    }
    run([shutil.which("chroot") or "/usr/sbin/chroot", str(root), *args], what=what, env=env)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def locked(cache: Path) -> Iterator[None]:
    """One build at a time uses the cache."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def cached(
    target: Path, make: Callable[[Path], dict[str, Any]], *, refresh: bool = False
) -> tuple[dict[str, Any], bool]:
    """``target``'s metadata, made by ``make(folder)`` when missing (into a temporary folder,
    renamed when complete, so an interrupted build leaves nothing half made); and whether it was
    there already."""
    done = target / "done.json"
    if done.is_file() and not refresh:
        meta: dict[str, Any] = json.loads(done.read_text())
        return meta, True
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    meta = make(tmp)
    (tmp / "done.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return meta, False


# Layer tars -----------------------------------------------------------------------------------

Entry = tuple[Path, str]
"""A file on this machine and its name in a layer."""

EMPTIED = frozenset(
    ("dev", "proc", "sys", "tmp", "run", "var/tmp", "var/lib/apt/lists", "var/cache/apt")
)
"""Folders of the base kept empty in its layer: the runtime mounts the first ones, the rest are
the build's leftovers."""


@dataclass(frozen=True)
class Layer:
    path: Path
    diff_id: str
    """sha256 of the uncompressed tar."""
    comment: str


class _Hashing(io.RawIOBase):
    """A write-only file that hashes what goes through it."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.digest = hashlib.sha256()
        self.pos = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.out.write(view)
        self.digest.update(view)
        self.pos += len(view)
        return len(view)

    def tell(self) -> int:
        return self.pos


def walk(top: Path, arc_top: str, *, emptied: frozenset[str] = frozenset()) -> Iterator[Entry]:
    """``top`` (named ``arc_top``; "" for a root, not listed) and everything below it, depth
    first in name order (as ``tar --sort=name``); the folders named in ``emptied`` (relative to
    ``top``) without their contents."""
    if arc_top:
        yield top, arc_top

    def below(folder: Path, rel: str) -> Iterator[Entry]:
        with os.scandir(folder) as it:
            found = sorted(it, key=lambda e: e.name)
        for entry in found:
            sub = f"{rel}/{entry.name}" if rel else entry.name
            yield Path(entry.path), f"{arc_top}/{sub}" if arc_top else sub
            if entry.is_dir(follow_symlinks=False) and sub not in emptied:
                yield from below(Path(entry.path), sub)

    yield from below(top, "")


def write_layer(path: Path, entries: Iterable[Entry], epoch: int) -> str:
    """A deterministic tar of ``entries`` (in their order); returns its sha256, the diff ID."""
    with open(path, "wb") as raw:
        sink = _Hashing(raw)
        with tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for full, arc in entries:
                info = tar.gettarinfo(str(full), arcname=arc)  # hard links found by inode
                if info is None:  # a socket: nothing a layer can hold
                    continue
                info.mtime = epoch
                info.uname = info.gname = ""
                if info.isreg():
                    with open(full, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return "sha256:" + sink.digest.hexdigest()


def _signature(path: Path) -> tuple[int, int, int, str]:
    st = path.lstat()
    link = os.readlink(path) if path.is_symlink() else ""
    return st.st_mode, st.st_size, st.st_mtime_ns, link


def parents(top: str) -> list[str]:
    """``a``, ``a/b`` for ``a/b/c``."""
    parts = top.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def added(before: Path, after: Path, top: str) -> list[Entry]:
    """What root file system ``after`` (a copy of ``before``, then changed) adds or changes below
    ``top``, with the parents of each, parents first. A removal would need a whiteout, which this
    builder does not write: it is an error."""
    gone = [arc for _, arc in walk(before / top, top) if not os.path.lexists(after / arc)]
    if gone:
        raise BuildError(f"installing the project removed {gone[:5]} from the cached environment")
    names: set[str] = set()
    for path, arc in walk(after / top, top):
        old = before / arc
        if os.path.lexists(old):
            if path.is_dir() and not path.is_symlink():
                continue  # a folder is written when something in it is
            if _signature(old) == _signature(path):
                continue
        names.update([*parents(arc), arc])
    return [(after / arc, arc) for arc in sorted(names, key=lambda a: a.split("/"))]


# 1. The Debian base ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BaseRecipe:
    """What the Debian root file system is made of; its hash names the cache entry."""

    suite: str = "bookworm"
    sources: tuple[str, ...] = (
        "deb http://deb.debian.org/debian bookworm main",
        "deb http://deb.debian.org/debian bookworm-updates main",
        "deb http://deb.debian.org/debian-security bookworm-security main",
    )
    """apt source lines (``--mirror`` replaces them, e.g. with a snapshot.debian.org URL)."""
    packages: tuple[str, ...] = (
        "python3-minimal",
        "libpython3.11-stdlib",
        "python3-venv",
        "libstdc++6",
        "ca-certificates",
        "openssl",
    )
    """On top of Debian's essential set: the interpreter, its standard library, venv (with pip's
    wheel, run once inside the chroot), the C++ runtime that grpcio's, protobuf's and
    frozenlist's extensions link, CA certificates, and the ``openssl`` command with which the
    webhook makes its certificates. make_deps checks every extension's libraries."""
    excluded: tuple[str, ...] = (
        "/usr/share/doc/*",
        "/usr/share/man/*",
        "/usr/share/info/*",
        "/usr/share/locale/*",
        "/usr/share/lintian/*",
    )
    arch: str = "amd64"
    recipe: int = 2
    """Bumped when what is done to the root file system after mmdebstrap changes."""

    def key(self, epoch: int) -> str:
        """The cache entry's name: the recipe and the layer's mtimes."""
        return _key(asdict(self), epoch)


def interpreter(rootfs: Path) -> str:
    """The root file system's ``python3.X``."""
    target = os.readlink(rootfs / "usr/bin/python3")
    if not re.fullmatch(r"python3\.\d+", target):
        raise BuildError(f"{rootfs}/usr/bin/python3 points at {target!r}, not python3.X")
    return target


def make_base(recipe: BaseRecipe, target: Path, epoch: int) -> dict[str, Any]:
    if shutil.which("mmdebstrap") is None:
        raise BuildError("mmdebstrap not found: install Debian's mmdebstrap")
    root = target / "root"
    log(f"making the Debian {recipe.suite} root file system with mmdebstrap (about 30 s)")
    run(
        [
            "mmdebstrap",
            "--mode=root",
            "--variant=essential",
            f"--architectures={recipe.arch}",
            f"--include={','.join(recipe.packages)}",
            *(f"--dpkgopt=path-exclude={p}" for p in recipe.excluded),
            recipe.suite,
            str(root),
            *recipe.sources,
        ],
        what="mmdebstrap",
    )
    python = interpreter(root)
    # Debian compiles the standard library into timestamp-checked .pyc files, which go stale
    # once the layer's mtimes are fixed (and would be recompiled in memory at every start):
    # unchecked-hash files instead.
    chroot_run(
        root,
        [f"/usr/bin/{python}", "-m", "compileall", "-q", "-f", "-j", "0",
         "--invalidation-mode", "unchecked-hash", f"/usr/lib/{python}"],
        what="compiling the standard library",
    )  # fmt: skip
    for leftover in ("etc/machine-id", "var/cache/ldconfig/aux-cache"):
        with contextlib.suppress(FileNotFoundError):
            (root / leftover).unlink()
    for entry in (root / "var/log").iterdir():
        if entry.is_file():
            entry.unlink()
    diff_id = write_layer(target / "layer.tar", walk(root, "", emptied=EMPTIED), epoch)
    return {"diff_id": diff_id, "python": python, "recipe": asdict(recipe), "epoch": epoch}


# 2. The dependencies --------------------------------------------------------------------------


def python_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise BuildError(f"--python {python} does not run: {out.stderr.strip()}")
    return out.stdout.strip()


def pip_wheel(rootfs: Path) -> str:
    """Debian's pip wheel in the root file system (python3-pip-whl), run from the wheel itself."""
    found = sorted((rootfs / "usr/share/python-wheels").glob("pip-*.whl"))
    if not found:
        raise BuildError(f"no pip wheel in {rootfs}/usr/share/python-wheels (python3-pip-whl)")
    return f"/usr/share/python-wheels/{found[-1].name}/pip"


def make_wheels(python: str, target: Path) -> dict[str, Any]:
    log("building the runtime dependencies' wheels (pinned by requirements/lock.txt)")
    run(
        [python, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
         "-c", str(REPO / "requirements/lock.txt"), "-w", str(target / "wheels"),
         *project()["dependencies"]],
        what="pip wheel (dependencies)",
    )  # fmt: skip
    return {"wheels": sorted(p.name for p in (target / "wheels").iterdir())}


def make_deps(base: Path, python: str, wheels: Path, target: Path, epoch: int) -> dict[str, Any]:
    """``target/root`` holds only /opt/koordinator: the environment with every dependency."""
    log(f"installing the dependencies into {PREFIX} (inside the base)")
    with tempfile.TemporaryDirectory(prefix="deps.", dir=target) as tmp:
        root = Path(tmp) / "rootfs"
        run(["cp", "-a", "--reflink=auto", str(base), str(root)], what="cp")
        inside = root / "tmp" / "wheels"
        shutil.copytree(wheels, inside)
        chroot_run(root, [f"/usr/bin/{python}", "-m", "venv", "--without-pip", PREFIX],
                   what="python -m venv")  # fmt: skip
        chroot_run(
            root,
            [f"{PREFIX}/bin/python", pip_wheel(root), "install", "-q", "--no-compile",
             "--find-links", "/tmp/wheels", *project()["dependencies"]],
            what="pip install (dependencies, no network)",
        )  # fmt: skip
        chroot_run(
            root,
            [f"{PREFIX}/bin/python", "-m", "compileall", "-q", "-j", "0",
             "--invalidation-mode", "unchecked-hash", f"{PREFIX}/lib"],
            what="compileall (dependencies)",
        )  # fmt: skip
        check_libraries(root)
        (target / "root" / "opt").mkdir(parents=True)
        shutil.copystat(root / "opt", target / "root" / "opt")
        (root / PREFIX.lstrip("/")).rename(target / "root" / PREFIX.lstrip("/"))
    top = PREFIX.lstrip("/")
    entries = [*((target / "root" / p, p) for p in parents(top)), *walk(target / "root" / top, top)]
    diff_id = write_layer(target / "layer.tar", entries, epoch)
    return {"diff_id": diff_id, "epoch": epoch}


def check_libraries(root: Path) -> None:
    """Every shared library of the environment finds its dependencies in the image (``ldd``
    inside the root file system); else the Debian package is missing from BaseRecipe.packages."""
    venv = root / PREFIX.lstrip("/")
    missing: dict[str, set[str]] = {}
    for lib in sorted(p for p in venv.rglob("*.so*") if p.is_file()):
        inside = f"/{lib.relative_to(root)}"
        out = subprocess.run(
            [shutil.which("chroot") or "/usr/sbin/chroot", str(root), "/usr/bin/ldd", inside],
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        for line in out.stdout.splitlines():
            if "not found" in line:
                missing.setdefault(line.split()[0], set()).add(inside)
    if missing:
        detail = "; ".join(f"{so} (for {', '.join(sorted(u)[:2])})" for so, u in missing.items())
        raise BuildError(f"libraries missing from the image: {detail}: add their Debian packages")


# 3. The project -------------------------------------------------------------------------------


def project_wheel(python: str, out: Path, work: Path) -> Path:
    """koordinator-py's wheel, built from a copy of its sources (nothing is written into the
    checkout)."""
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, src / name)
    with open(REPO / "pyproject.toml", "rb") as f:
        find = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]
    for pattern in find["include"]:
        top = pattern.rstrip("*")
        if (REPO / top).is_dir() and not (src / top).exists():
            shutil.copytree(
                REPO / top,
                src / top,
                # *.so: the checkout's own build of the native reader; the wheel builds its own
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.so.1"),
            )
    run(
        [python, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
         "--no-build-isolation", "-w", str(out), str(src)],
        what="pip wheel (koordinator-py)",
    )  # fmt: skip
    (wheel,) = out.glob("koordinator_py-*.whl")
    return wheel


def wheel_paths(wheel: Path, python: str) -> list[str]:
    """What installing ``wheel`` writes below /opt/koordinator: its files (RECORD), the .pyc of
    each module, its console scripts."""
    site = f"lib/{python}/site-packages"
    tag = "cpython-" + python.removeprefix("python").replace(".", "")
    with zipfile.ZipFile(wheel) as z:
        (record,) = [n for n in z.namelist() if n.endswith(".dist-info/RECORD")]
        files = [row.rsplit(",", 2)[0] for row in z.read(record).decode().splitlines() if row]
        (eps,) = [n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")]
        entry_points = configparser.ConfigParser(delimiters=("=",), interpolation=None)
        entry_points.optionxform = str  # type: ignore[assignment,method-assign]
        entry_points.read_string(z.read(eps).decode())
    scripts = list(entry_points["console_scripts"]) if "console_scripts" in entry_points else []
    out = [f"{site}/{f}" for f in files] + [f"bin/{s}" for s in scripts]
    for f in files:
        if f.endswith(".py"):
            folder, _, name = f"{site}/{f}".rpartition("/")
            out.append(f"{folder}/__pycache__/{name[:-3]}.{tag}.pyc")
    return out


def install_project(root: Path, python: str, wheel: Path) -> None:
    """The project's wheel into /opt/koordinator (its dependencies are there).

    The tree is hard links to the cache: a file that is already there would be written through
    to the cache, so every path the install writes must be new (pip then creates each file, and
    compile_new only the new modules' byte code)."""
    venv = root / PREFIX.lstrip("/")
    clash = [p for p in wheel_paths(wheel, python) if os.path.lexists(venv / p)]
    if clash:
        raise BuildError(f"koordinator-py's wheel would overwrite {clash[:5]} in {PREFIX}")
    inside = root / "tmp" / wheel.name
    shutil.copy2(wheel, inside)
    chroot_run(
        root,
        [f"{PREFIX}/bin/python", pip_wheel(root), "install", "-q", "--no-compile", "--no-deps",
         f"/tmp/{wheel.name}"],
        what="pip install koordinator-py (no network)",
    )  # fmt: skip
    inside.unlink()
    missing = [c for c in COMPONENTS if not (venv / "bin" / c).is_file()]
    if missing:
        raise BuildError(f"{PREFIX}/bin lacks {missing} after the install")


def compile_new(root: Path, before: Path) -> None:
    """Byte code for the .py files the project added."""
    top = PREFIX.lstrip("/")
    new = [f"/{arc}" for _, arc in added(before, root, top) if arc.endswith(".py")]
    if new:
        chroot_run(
            root,
            [f"{PREFIX}/bin/python", "-m", "compileall", "-q",
             "--invalidation-mode", "unchecked-hash", *new],
            what="compileall (koordinator-py)",
        )  # fmt: skip


# The OCI layout -------------------------------------------------------------------------------


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def image_config(layers: Sequence[Layer], version: str, epoch: int) -> dict[str, Any]:
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "Entrypoint": ENTRYPOINT,
            "Cmd": CMD,
            "Env": [f"{k}={v}" for k, v in ENV.items()],
            "User": "0",
            "WorkingDir": "/",
            "ExposedPorts": {p: {} for p in EXPOSED_PORTS},
            "Labels": labels(version),
        },
        "rootfs": {"type": "layers", "diff_ids": [la.diff_id for la in layers]},
        "history": [{"created": created, "created_by": la.comment} for la in layers],
    }


def _gzipped(path: Path, work: Path) -> Path:
    out = work / f"{path.parent.name}-{path.name}.gz"
    with (
        open(path, "rb") as src,
        open(out, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz,
    ):
        shutil.copyfileobj(src, gz, 1 << 20)
    return out


def write_layout(
    out: Path, ref: str, layers: Sequence[Layer], version: str, epoch: int,
    *, compress: bool, work: Path,
) -> str:  # fmt: skip
    """The OCI image-layout tar at ``out``; returns the manifest's digest."""
    blobs: dict[str, bytes | Path] = {}

    def blob(data: bytes | Path) -> dict[str, Any]:
        if isinstance(data, Path):
            digest, size = sha256_file(data), data.stat().st_size
        else:
            digest, size = "sha256:" + hashlib.sha256(data).hexdigest(), len(data)
        blobs[digest] = data
        return {"digest": digest, "size": size}

    descriptors = []
    for layer in layers:
        data = _gzipped(layer.path, work) if compress else layer.path
        media = MEDIA_LAYER_GZIP if compress else MEDIA_LAYER
        descriptors.append({"mediaType": media, **blob(data)})
    config = blob(_json(image_config(layers, version, epoch)))
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, **config},
        "layers": descriptors,
    }
    man = blob(_json(manifest))
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                **man,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": ref,  # the name containerd's import gives it
                    "org.opencontainers.image.ref.name": ref.rpartition(":")[2],
                },
            }
        ],
    }
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, data: bytes | Path | None) -> None:
            info = tarfile.TarInfo(name)
            info.mtime = epoch
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(data, Path):
                info.size, info.mode = data.stat().st_size, 0o644
                with open(data, "rb") as f:
                    tar.addfile(info, f)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))

        add("blobs", None)
        add("blobs/sha256", None)
        for digest in sorted(blobs):
            add(f"blobs/sha256/{digest.removeprefix('sha256:')}", blobs[digest])
        add("oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        add("index.json", _json(index))
    tmp.rename(out)
    return str(man["digest"])


# Main -----------------------------------------------------------------------------------------

REF = re.compile(
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::\d+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+"
    r":[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
)
"""``host[:port]/path:tag`` in the distribution reference grammar (a registry host and a tag are
required: the manifests name the image that way)."""


def build(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    if not REF.fullmatch(args.ref):
        raise BuildError(f"--ref {args.ref!r} is not HOST[:PORT]/PATH:TAG, e.g. {default_ref()}")
    if os.geteuid() != 0:
        raise BuildError("needs root: mmdebstrap's root mode and chroot")
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    version = project()["version"]
    recipe = BaseRecipe(sources=tuple(args.mirror)) if args.mirror else BaseRecipe()
    cache: Path = args.cache.resolve()
    out: Path = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        now = time.monotonic()
        timings[name] = round(now - since, 1)
        return now

    with locked(cache):
        t = time.monotonic()
        base_dir = cache / f"base-{recipe.key(epoch)}"
        base, base_cached = cached(
            base_dir, lambda d: make_base(recipe, d, epoch), refresh=args.refresh_base
        )
        python = base["python"]
        if (host := python_version(args.python)) != python.removeprefix("python"):
            raise BuildError(
                f"the wheels would be built by {args.python} (Python {host}) but the image "
                f"runs {python}: pass --python with a {python} interpreter that has pip and "
                "setuptools (scripts/dev.sh setup makes .venv/bin/python)"
            )
        t = lap("base", t)
        lock = (REPO / "requirements/lock.txt").read_text()
        wheels_dir = cache / f"wheels-{_key(lock, project()['dependencies'], python)}"
        _, wheels_cached = cached(wheels_dir, lambda d: make_wheels(args.python, d))
        deps_dir = cache / f"deps-{_key(base['diff_id'], wheels_dir.name, 1)}"
        deps, deps_cached = cached(
            deps_dir,
            lambda d: make_deps(base_dir / "root", python, wheels_dir / "wheels", d, epoch),
        )
        t = lap("deps", t)
        with tempfile.TemporaryDirectory(prefix="koordimage.", dir=out.parent) as tmp:
            work = Path(tmp)
            wheel = project_wheel(args.python, work / "dist", work)
            t = lap("wheel", t)
            root = work / "rootfs"
            # hard links to the cached trees: only new files are written below (see
            # install_project), so the caches are read, never changed
            run(["cp", "-al", str(base_dir / "root"), str(root)], what="cp")
            run(["cp", "-al", str(deps_dir / "root" / "opt"), str(root)], what="cp")
            install_project(root, python, wheel)
            compile_new(root, deps_dir / "root")
            app = work / "project.tar"
            diff_id = write_layer(app, added(deps_dir / "root", root, PREFIX.lstrip("/")), epoch)
            t = lap("project", t)
            layers = [
                Layer(
                    base_dir / "layer.tar",
                    base["diff_id"],
                    f"Debian {recipe.suite}: {' '.join(recipe.packages)} (mmdebstrap)",
                ),
                Layer(deps_dir / "layer.tar", deps["diff_id"], f"{PREFIX}: dependencies"),
                Layer(app, diff_id, f"{PREFIX}: koordinator-py {version} (packaging/image.py)"),
            ]
            log(f"writing {out}")
            digest = write_layout(
                out, args.ref, layers, version, epoch, compress=args.gzip, work=work
            )
            lap("layout", t)
    return {
        "ref": args.ref,
        "archive": str(out),
        "bytes": out.stat().st_size,
        "manifest_digest": digest,
        "cached": {"base": base_cached, "wheels": wheels_cached, "deps": deps_cached},
        "seconds": round(time.monotonic() - started, 1),
        "steps": timings,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Build koordinator-py's image as an OCI image-layout tar (for "
        "`ctr -n k8s.io images import`), without Docker or a registry."
    )
    p.add_argument("--out", type=Path, required=True, help="the archive to write (.oci.tar)")
    p.add_argument("--ref", default=default_ref(), help="the image's name (default %(default)s)")
    p.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE,
        help="where the Debian base, the dependencies' wheels and layer are kept "
        "(default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--python", default=str(REPO / ".venv" / "bin" / "python"),
        help="the interpreter (with pip and setuptools) that builds the wheels; its X.Y must "
        "be the image's (default %(default)s, as scripts/dev.sh setup makes it)",
    )  # fmt: skip
    p.add_argument(
        "--mirror", action="append", metavar="SOURCES_LINE",
        help="an apt source line for mmdebstrap (repeat it; replaces the default Debian mirrors)",
    )  # fmt: skip
    p.add_argument("--refresh-base", action="store_true", help="make the Debian base again")
    p.add_argument("--gzip", action="store_true", help="compress the layers (smaller, slower)")
    args = p.parse_args(argv)
    try:
        summary = build(args)
    except BuildError as err:
        print(f"packaging/image.py: {err}", file=sys.stderr)
        return 1
    log(
        f"built {summary['ref']} in {summary['seconds']} s: {summary['archive']} "
        f"({summary['bytes'] / 2**20:.0f} MiB)"
    )
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
