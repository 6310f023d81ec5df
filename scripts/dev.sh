#!/usr/bin/env bash
# Bootstrap and run koordinator-py on a fresh Debian/Ubuntu machine.
#   scripts/dev.sh run   [koordlet flags...]   set up, then run koordlet standalone on this host
#                                             (in dry run unless --dry-run=false is given)
#   scripts/dev.sh test  [pytest args...]      set up, then run lint, types, contracts and all tests
#   scripts/dev.sh setup                       only set up (.venv with the pinned packages)
# Idempotent: a second call reuses .venv when requirements/lock.txt has not changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=$ROOT/.venv
export DEBIAN_FRONTEND=noninteractive

log() { printf '==> %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else
    log "need root for: $*"; return 1; fi
}

pick_python() {
  for py in python3.13 python3.12 python3.11 python3; do
    if command -v "$py" >/dev/null 2>&1 &&
       "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  return 1
}

apt_install() {
  command -v apt-get >/dev/null || { log "no apt-get: install $* by hand"; return 1; }
  log "installing apt packages: $*"
  as_root apt-get update -qq </dev/null
  as_root apt-get install -y -qq --no-install-recommends "$@" </dev/null
}

setup() {
  local py
  if ! py=$(pick_python); then
    apt_install python3 python3-venv
    py=$(pick_python) || { log "Python 3.11 or newer is required"; exit 1; }
  fi
  if ! "$py" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    local ver; ver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    apt_install "python${ver}-venv" || apt_install python3-venv
  fi
  # gcc builds the koordlet's native column reader (setup.py, koordlet/system/_colread.c): about
  # a fifth of its CPU at 200 pods. Without it the koordlet reads those files in Python.
  command -v gcc >/dev/null || apt_install gcc libc6-dev ||
    log "without gcc the koordlet reads its cgroup columns in Python (koordlet.system.nativeread)"
  # The stamp is the lock, pyproject.toml and the native reader's sources: a new console script,
  # package or C change reinstalls too; so does a missing build of the reader where gcc is.
  local stamp=$VENV/.lock-stamp
  local sources=(requirements/lock.txt pyproject.toml setup.py koordlet/system/_colread.c)
  if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && cat "${sources[@]}" | cmp -s "$stamp" - &&
     { ! command -v gcc >/dev/null || [ -f koordlet/system/_colread.so.1 ]; }; then
    return 0
  fi
  log "creating $VENV with $py"
  "$py" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip </dev/null
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements/lock.txt </dev/null
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . </dev/null
  cat "${sources[@]}" >"$stamp"
}

test_tools() {
  # The packaging tests build an .rpm (rpmbuild) and verify the units (systemd-analyze); the
  # runtime hook tests run a real containerd (its CRI plugin, runc) on images built from a static
  # busybox (tests/runtimehooks/containerd.py); the /debug/ui test renders the page in a headless
  # Chromium (Debian's chromium); the alert and dashboard tests run Debian's prometheus and its
  # promtool (tests/ui/test_alerts.py, tests/ui/test_grafana_dashboard.py); the container image
  # tests build the image from Debian's packages with mmdebstrap (packaging/image.py).
  local need=()
  command -v rpmbuild >/dev/null || need+=(rpm)
  command -v systemd-analyze >/dev/null || need+=(systemd)
  command -v dpkg-deb >/dev/null || need+=(dpkg)
  command -v containerd >/dev/null || need+=(containerd)
  command -v runc >/dev/null || need+=(runc)
  dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
  command -v chromium >/dev/null || need+=(chromium)
  command -v gcc >/dev/null || need+=(gcc libc6-dev)  # the GPU tests build a fake NVML library
  { command -v prometheus && command -v promtool; } >/dev/null || need+=(prometheus)
  # the real-cluster tier (tests/realcluster, envtest): etcd beside ../shared/k8s's binaries,
  # the CNI plugins for the pods' bridge, iptables for the kubernetes Service's DNAT
  command -v etcd >/dev/null || need+=(etcd-server)
  [ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
  command -v iptables >/dev/null || need+=(iptables)
  command -v mmdebstrap >/dev/null || need+=(mmdebstrap)  # the project's image (packaging/image.py)
  [ ${#need[@]} -eq 0 ] || apt_install "${need[@]}" ||
    log "without ${need[*]}: the tests that need them skip with the reason"
}

dry_run_in() {
  # Whether koordlet --dry-run "$@" runs in dry run: the last --dry-run[=BOOL] (or -dry-run, or
  # --dry-run BOOL) wins, as the koordlet's parser reads it; Go's booleans.
  local dry=true next=""
  for a in "$@"; do
    if [ -n "$next" ]; then
      case "$a" in true|false|TRUE|FALSE|True|False|t|f|T|F|1|0) dry=$a ;; esac
      next=""; continue
    fi
    case "$a" in
      --dry-run|-dry-run) dry=true; next=1 ;;
      --dry-run=*|-dry-run=*) dry=${a#*=} ;;
    esac
  done
  case "$dry" in false|FALSE|False|f|F|0) return 1 ;; *) return 0 ;; esac
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  setup) setup ;;
  run)
    setup
    log "starting koordlet standalone on this host (Ctrl-C to stop); http://127.0.0.1:9316/metrics"
    if dry_run_in "$@"; then
      log "dry run: QoS decisions are logged and audited, nothing is written (--dry-run=false acts)"
    else
      log "NOT a dry run: QoS strategies write cgroups, sysctls and resctrl and may evict;" \
        "'koordlet reset' puts back what it wrote (docs/baremetal.md)"
    fi
    exec "$VENV/bin/koordlet" --standalone --dry-run "$@"
    ;;
  test)
    setup
    test_tools
    export PATH=$VENV/bin:$PATH
    log "ruff";          ruff check .
    log "ruff format";   ruff format --check .
    log "mypy";          mypy
    log "import-linter"; lint-imports
    log "pytest";        python -m pytest -p no:cacheprovider "$@"
    ;;
  *) echo "usage: $0 {run|test|setup} [args...]" >&2; exit 2 ;;
esac
