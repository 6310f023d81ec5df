#!/usr/bin/env bash
# Check the koordlet's GPU path on a machine with a real NVIDIA GPU: run from the repository root
#   bash scripts/gpu_check.sh
# It installs nothing and needs no network. It runs scripts/gpu_check.py (docs/devices.md) with
#   1. .venv/bin/python, when that interpreter runs here (the venv carried from the build machine);
#   2. else the python3.X of the venv's version found on PATH, with the repository and the venv's
#      site-packages on PYTHONPATH;
#   3. else python3 (3.11 or newer) the same way: nvidia-ml-py and the koordlet's code are pure
#      Python, and the compiled dependencies fall back to their Python versions or are not used.
# Exit status: 0 every check holds, 1 a check failed, 2 no usable NVML (or no Python) here.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
say() { printf '==> %s\n' "$*" >&2; }

venv_version=""
if [ -f .venv/pyvenv.cfg ]; then
  venv_version=$(sed -n 's/^version *= *\([0-9]*\.[0-9]*\).*/\1/p' .venv/pyvenv.cfg)
fi

if [ -x .venv/bin/python ] && .venv/bin/python -c 'import pynvml, koordlet' 2>/dev/null; then
  say "using the venv's interpreter: .venv/bin/python ($(.venv/bin/python -V 2>&1))"
  exec .venv/bin/python scripts/gpu_check.py
fi

py=""
for candidate in ${venv_version:+python$venv_version} python3; do
  if command -v "$candidate" >/dev/null 2>&1 &&
     "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
    py=$(command -v "$candidate"); break
  fi
done
if [ -z "$py" ]; then
  say "no usable Python: .venv/bin/python does not run here and no python3 >= 3.11 is on PATH"
  exit 2
fi
version=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
site=$(ls -d "$ROOT"/.venv/lib/python*/site-packages 2>/dev/null | head -n1 || true)
if [ -z "$site" ]; then
  say "no .venv here: build it first (scripts/dev.sh setup, needs the network)"
  exit 2
fi
if [ "$version" != "$venv_version" ]; then
  say "warning: $py is Python $version, the venv was built for $venv_version;" \
      "only its pure-Python packages will load"
fi
say "the venv's interpreter does not run here; using $py (Python $version)" \
    "with PYTHONPATH=$ROOT:$site"
export PYTHONPATH="$ROOT:$site${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" scripts/gpu_check.py
