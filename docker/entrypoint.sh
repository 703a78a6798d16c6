#!/bin/sh
# Start `python3 -m sglang.launch_server` on $MODEL_PATH, listening on $HOST:$PORT; the container's
# arguments are appended. DSV41_DEVICE=cpu serves on CPU and, with MODEL_PATH empty, serves the
# embedded tiny model (sglang_dsv41.tools.serve writes it once).
set -eu
if [ "${DSV41_DEVICE:-cuda}" = "cpu" ]; then
    if [ -n "${MODEL_PATH:-}" ]; then
        set -- --model-path "$MODEL_PATH" "$@"
    fi
    exec python3 -m sglang_dsv41.tools.serve --host "${HOST:-0.0.0.0}" --port "${PORT:-30000}" \
        --device cpu "$@"
fi
if [ -z "${MODEL_PATH:-}" ] || [ ! -f "$MODEL_PATH/config.json" ]; then
    echo "dsv41-entrypoint: MODEL_PATH='${MODEL_PATH:-}' holds no config.json;" \
        "mount a V4.1 checkpoint and set MODEL_PATH to it" >&2
    exit 2
fi
exec python3 -m sglang.launch_server --model-path "$MODEL_PATH" --host "${HOST:-0.0.0.0}" \
    --port "${PORT:-30000}" "$@"
