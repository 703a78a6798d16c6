#!/usr/bin/env bash
# Build (or reuse) the Python environment that serves and tests sglang-dsv41, then install this
# checkout into a thin per-checkout environment. Prints that environment's python on the last
# line of stdout.
#
# The heavy environment (SGLang, torch: ~5 minutes and ~11 GB) lives outside the clone, keyed by
# the pins in requirements/env.txt and the Python version, so a second clone or a CI run on the
# same machine reuses it; when none exists it is built from scratch. The checkout gets its own
# small venv in .venv/ whose site-packages points at the shared one, with this package installed
# editable, so two checkouts never fight over which one the shared environment imports.
#   DSV41_ENV_ROOT   where shared environments are kept (default ~/.cache/sglang-dsv41)
#   PYTHON           the interpreter to build with (default python3)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-python3}"
root="${DSV41_ENV_ROOT:-$HOME/.cache/sglang-dsv41}"
key="$( { cat "$here/requirements/env.txt"; "$py" -c 'import sys; print(sys.version_info[:2])'; } \
        | sha256sum | cut -c1-12)"
env="$root/env-$key"
if [ ! -f "$env/.complete" ]; then
  echo "[setup] building the shared environment $env (first time: ~5 min, ~11 GB)" >&2
  rm -rf "$env"
  mkdir -p "$root"
  "$py" -m venv "$env"
  "$env/bin/python" -m pip install -q --upgrade pip >&2
  "$env/bin/python" -m pip install -r "$here/requirements/env.txt" >&2
  touch "$env/.complete"
else
  echo "[setup] reusing the shared environment $env" >&2
fi
shared_site="$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
venv="$here/.venv"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.shared" 2>/dev/null)" != "$env" ]; then
  rm -rf "$venv"
  "$env/bin/python" -m venv --without-pip "$venv"
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$shared_site" > "$site/_dsv41_shared_env.pth"
  echo "$env" > "$venv/.shared"
fi
log="$venv/install.log"
if ! "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$here" >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
echo "$venv/bin/python"
