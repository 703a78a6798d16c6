#!/usr/bin/env bash
# Build (or reuse) the Python environment that serves and tests sglang-dsv41, then install
# this checkout into it. Prints the environment's python on the last line of stdout.
#
# The environment lives outside the clone, keyed by the pins in requirements/env.txt and the
# Python version, so a second clone or a CI run on the same machine reuses it (installing
# SGLang costs ~5 minutes and ~11 GB); when no such environment exists it is built from scratch.
#   DSV41_ENV_ROOT   where environments are kept (default ~/.cache/sglang-dsv41)
#   PYTHON           the interpreter to build it with (default python3)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-python3}"
root="${DSV41_ENV_ROOT:-$HOME/.cache/sglang-dsv41}"
key="$( { cat "$here/requirements/env.txt"; "$py" -c 'import sys; print(sys.version_info[:2])'; } \
        | sha256sum | cut -c1-12)"
env="$root/env-$key"
if [ ! -f "$env/.complete" ]; then
  echo "[setup] building environment $env (first time: ~5 min, ~11 GB)" >&2
  rm -rf "$env"
  mkdir -p "$root"
  "$py" -m venv "$env"
  "$env/bin/python" -m pip install -q --upgrade pip >&2
  "$env/bin/python" -m pip install -r "$here/requirements/env.txt" >&2
  touch "$env/.complete"
else
  echo "[setup] reusing environment $env" >&2
fi
"$env/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$here" >&2
echo "$env/bin/python"
