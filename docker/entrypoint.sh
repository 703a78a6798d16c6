#!/bin/sh
# Start `python3 -m sglang.launch_server` on $MODEL_PATH, listening on $HOST:$PORT; the container's
# arguments are appended. DSV41_DEVICE=cpu serves on CPU and, with MODEL_PATH empty, serves the
# embedded retrieval model (sglang_dsv41.tools.serve's default; --model-path tiny: the random one).
# API_KEY / ADMIN_API_KEY become --api-key / --admin-api-key (every route / the admin routes such
# as /pause_generation). A HOST beyond loopback without an API key is refused unless
# DSV41_ALLOW_NO_API_KEY=1 says so: without a key every route, admin routes included, is open to
# whoever reaches the port.
set -eu
host="${HOST:-0.0.0.0}"
keyed=""
for arg in "$@"; do
    case "$arg" in
        --api-key | --api-key=*) keyed=1 ;;
    esac
done
if [ -n "${API_KEY:-}" ]; then
    keyed=1
    set -- --api-key "$API_KEY" "$@"
fi
if [ -n "${ADMIN_API_KEY:-}" ]; then
    set -- --admin-api-key "$ADMIN_API_KEY" "$@"
fi
case "$host" in
    127.* | localhost | ::1) loopback=1 ;;
    *) loopback="" ;;
esac
if [ -z "$loopback" ] && [ -z "$keyed" ] && [ "${DSV41_ALLOW_NO_API_KEY:-}" != "1" ]; then
    echo "dsv41-entrypoint: HOST=$host listens beyond loopback and no API key is set: set" \
        "API_KEY (and ADMIN_API_KEY for the admin routes), or HOST=127.0.0.1, or" \
        "DSV41_ALLOW_NO_API_KEY=1 to serve every route without a key" >&2
    exit 2
fi
if [ "${DSV41_DEVICE:-cuda}" = "cpu" ]; then
    if [ -n "${MODEL_PATH:-}" ]; then
        set -- --model-path "$MODEL_PATH" "$@"
    fi
    exec python3 -m sglang_dsv41.tools.serve --host "$host" --port "${PORT:-30000}" \
        --device cpu "$@"
fi
if [ -z "${MODEL_PATH:-}" ] || [ ! -f "$MODEL_PATH/config.json" ]; then
    echo "dsv41-entrypoint: MODEL_PATH='${MODEL_PATH:-}' holds no config.json;" \
        "mount a V4.1 checkpoint and set MODEL_PATH to it" >&2
    exit 2
fi
exec python3 -m sglang.launch_server --model-path "$MODEL_PATH" --host "$host" \
    --port "${PORT:-30000}" "$@"
