#!/usr/bin/env bash
# Build dist/koordinator-py_<version>_amd64.deb and dist/koordinator-py-<version>-1.x86_64.rpm
# from this repository (`make packages`).
#
# What goes in: a private virtual environment at /opt/koordinator (the project and its runtime
# dependencies, pinned by requirements/lock.txt), /usr/bin/koordlet, the systemd units, the
# configuration in /etc/koordinator (conffiles / %config(noreplace)) and docs/baremetal.md.
# The environment's interpreter is a symlink to /usr/bin/python3.X of the build host's Python:
# the package depends on that interpreter, so build on the distribution family you install on.
#
# Environment:
#   PYTHON        interpreter the packaged venv runs on (default /usr/bin/python3, >= 3.11)
#   BUILD_PYTHON  interpreter with pip and setuptools that builds the project's wheel
#                 (default .venv/bin/python, as scripts/dev.sh setup makes it)
#   DIST          output folder (default dist/)
#   PIP_*         passed to pip as usual (PIP_INDEX_URL, PIP_FIND_LINKS for a wheelhouse...)
#   SKIP_RPM=1    build the .deb only
# Needs: dpkg-deb (apt package dpkg) for the .deb, rpmbuild (apt package rpm) for the .rpm;
# network access to the package index or a wheelhouse for the dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PREFIX=/opt/koordinator
NAME=koordinator-py
PYTHON=${PYTHON:-/usr/bin/python3}
BUILD_PYTHON=${BUILD_PYTHON:-$ROOT/.venv/bin/python}
DIST=${DIST:-$ROOT/dist}

log() { printf "==> %s %s\n" "$(date +%T)" "$*" >&2; }
die() { printf 'packaging/build.sh: %s\n' "$*" >&2; exit 1; }

command -v dpkg-deb >/dev/null || die "dpkg-deb not found: install the apt package dpkg"
[ -x "$PYTHON" ] || die "$PYTHON not found: set PYTHON to a Python >= 3.11 interpreter"
PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$PYTHON" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' ||
  die "$PYTHON ($PYVER) needs to be >= 3.11 with venv and ensurepip (apt package python3-venv)"
# The venv links to the versioned name, which stays valid when python3 moves to another version.
PYBIN=$(dirname "$PYTHON")/python$PYVER
[ -x "$PYBIN" ] || die "$PYBIN not found next to $PYTHON"
[ -x "$BUILD_PYTHON" ] || die "$BUILD_PYTHON not found: run scripts/dev.sh setup or set BUILD_PYTHON"
VERSION=$("$BUILD_PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
ARCH=$(dpkg --print-architecture 2>/dev/null || echo amd64)
[ "$ARCH" = amd64 ] || die "only amd64 is packaged (the wheels pinned are x86_64), this is $ARCH"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/koordpkg.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STAGE=$WORK/stage
VENV=$STAGE$PREFIX

# 1. The private environment, built where it will live (below the staging root) ---------------
log "building the project wheel"
"$BUILD_PYTHON" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
  -w "$WORK/wheels" "$ROOT" </dev/null
rm -rf "$ROOT/build"  # setuptools' scratch folder
log "creating $PREFIX with $PYBIN ($PYVER)"
"$PYBIN" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile \
  -c requirements/lock.txt "$WORK"/wheels/*.whl </dev/null
# The seeded installers are not runtime dependencies (and setuptools would be unpinned).
"$VENV/bin/python" -m pip uninstall -q -y setuptools pip </dev/null
find "$VENV" -depth -name __pycache__ -type d -exec rm -rf {} +
rm -f "$VENV"/lib/python*/site-packages/koordinator_py-*.dist-info/direct_url.json

# 2. Relocate: every text file naming the staging path names /opt/koordinator instead ---------
grep -rlI --null -- "$STAGE" "$VENV" | xargs -0 -r sed -i "s|$STAGE||g"
if grep -rlI -- "$STAGE" "$VENV"; then die "staging path left in the files above"; fi
# Byte-code compiled now, with the installed paths in it, so that nothing is written at run time
# (and nothing is left behind at removal).
"$VENV/bin/python" -m compileall -q -j 0 -s "$STAGE" -p / "$VENV/lib" >/dev/null

# 3. The rest of the tree ----------------------------------------------------------------------
install -d "$STAGE/usr/bin" "$STAGE/etc/koordinator" "$STAGE/usr/share/doc/$NAME"
ln -s "$PREFIX/bin/koordlet" "$STAGE/usr/bin/koordlet"
ln -s "$PREFIX/bin/koord-runtime-proxy" "$STAGE/usr/bin/koord-runtime-proxy"
install -m 0644 packaging/etc/koordlet.yaml packaging/etc/nodeslo.yaml "$STAGE/etc/koordinator/"
install -m 0644 docs/baremetal.md docs/runtimehooks.md "$STAGE/usr/share/doc/$NAME/"
printf 'koordinator-py %s\nLicense: Apache-2.0\n' "$VERSION" >"$STAGE/usr/share/doc/$NAME/copyright"
UNITS=(koordlet.service koordlet.slice host-latency-sensitive.slice host-best-effort.slice
  koord-runtime-proxy.service)
mkdir -p "$DIST"

# 4. .deb ---------------------------------------------------------------------------------------
DEB=$WORK/deb
cp -a "$STAGE" "$DEB"
install -d "$DEB/lib/systemd/system" "$DEB/DEBIAN"
for u in "${UNITS[@]}"; do install -m 0644 "systemd/$u" "$DEB/lib/systemd/system/$u"; done
SIZE=$(du -sk --exclude=DEBIAN "$DEB" | cut -f1)
sed -e "s|@VERSION@|$VERSION|" -e "s|@ARCH@|$ARCH|" -e "s|@SIZE@|$SIZE|" \
  -e "s|@PYDEP@|python$PYVER|" packaging/deb/control >"$DEB/DEBIAN/control"
install -m 0644 packaging/deb/conffiles "$DEB/DEBIAN/conffiles"
for s in postinst prerm postrm; do install -m 0755 "packaging/deb/$s" "$DEB/DEBIAN/$s"; done
DEBFILE=$DIST/${NAME}_${VERSION}_${ARCH}.deb
log "building $DEBFILE"
dpkg-deb --root-owner-group -Zgzip -z6 --build "$DEB" "$DEBFILE" >/dev/null

# 5. .rpm ---------------------------------------------------------------------------------------
if [ "${SKIP_RPM:-}" = 1 ]; then
  log "SKIP_RPM=1: no .rpm"
  exit 0
fi
if ! command -v rpmbuild >/dev/null; then
  log "rpmbuild not found: no .rpm built (install the apt package rpm, or the rpm-build package)"
  exit 3
fi
RPMROOT=$WORK/rpmroot
cp -a "$STAGE" "$RPMROOT"
install -d "$RPMROOT/usr/lib/systemd/system"
for u in "${UNITS[@]}"; do install -m 0644 "systemd/$u" "$RPMROOT/usr/lib/systemd/system/$u"; done
log "building the .rpm"
rpmbuild -bb --quiet --target x86_64 \
  --define "_topdir $WORK/rpmbuild" \
  --define "_rpmdir $DIST" \
  --define "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm" \
  --define "kpy_version $VERSION" \
  --define "kpy_root $RPMROOT" \
  --define "kpy_python /usr/bin/python$PYVER" \
  packaging/rpm/koordinator-py.spec >/dev/null
log "built $DEBFILE and $DIST/$NAME-$VERSION-1.x86_64.rpm"
