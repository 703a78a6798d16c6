"""Who can reach the server, and what it never shows: the API keys.

SGLang's `--api-key` guards every route and `--admin-api-key` the admin routes
(`/pause_generation`, `/flush_cache`, `/update_weights_*`, ...: SGLang marks them
ADMIN_OPTIONAL; with an admin key set they take only that key). Without either key every route
is open to whoever reaches the port, so a server that listens beyond loopback without a key
logs a warning naming both flags (the CPU docker image refuses to start that way unless told,
docker/entrypoint.sh).

SGLang prints its resolved arguments at start (`server_args=...`), returns them from
`/server_info` and `/get_server_info`, and keeps the launch command line; it redacts its
watermark secrets in all of them through two functions, and hooks on those two redact the API
keys as well.
"""

from __future__ import annotations

import ipaddress
import logging

logger = logging.getLogger(__name__)

_REDACT = "sglang.srt.sampling.watermarking.core.redact_watermark_secrets"
_REDACT_ARGV = "sglang.srt.sampling.watermarking.core.redact_watermark_command_line"
_FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"

SECRET_FIELDS = ("api_key", "admin_api_key")
SECRET_FLAGS = ("--api-key", "--admin-api-key")
REDACTED = "<redacted>"


def is_loopback(host) -> bool:
    """True for a host only this machine reaches (localhost, 127.0.0.0/8, ::1)."""
    if not host:
        return False
    if str(host).lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(str(host).strip("[]")).is_loopback
    except ValueError:
        return False


def redact_fields(value):
    """A dict with its SECRET_FIELDS (top level) replaced by REDACTED where set."""
    if isinstance(value, dict) and any(value.get(k) for k in SECRET_FIELDS):
        return {k: (REDACTED if k in SECRET_FIELDS and v else v) for k, v in value.items()}
    return value


def redact_argv(argv) -> list:
    """argv with the value of every SECRET_FLAGS flag replaced (`--api-key K`, `--api-key=K`)."""
    out, hide = [], False
    for arg in argv:
        flag, eq, _ = str(arg).partition("=")
        if hide:
            out.append(REDACTED)
            hide = False
        elif arg in SECRET_FLAGS:
            out.append(arg)
            hide = True
        elif eq and flag in SECRET_FLAGS:
            out.append(f"{flag}={REDACTED}")
        else:
            out.append(arg)
    return out


def exposure_warning(host, api_key, admin_api_key) -> str | None:
    """The warning for a server that anyone beyond this machine may drive, or None."""
    if is_loopback(host) or api_key:
        return None
    admin = "" if admin_api_key else " and admin routes (/pause_generation, /flush_cache, ...)"
    return (
        f"sglang_dsv41: listening on {host} without --api-key: generation{admin} are open to "
        "any client that reaches the port; set --api-key (and --admin-api-key for the admin "
        "routes) or listen on 127.0.0.1"
    )


def _redact(result, *args, **kwargs):
    return redact_fields(result)


def _redact_argv(original, argv, *args, **kwargs):
    return original(redact_argv(argv), *args, **kwargs)


def _warn(result, cls, args, *rest, **kwargs):
    message = exposure_warning(
        getattr(result, "host", None),
        getattr(result, "api_key", None),
        getattr(result, "admin_api_key", None),
    )
    if message:
        logger.warning(message)
    return result


def register_access() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(_REDACT, _redact, HookType.AFTER)
    HookRegistry.register(_REDACT_ARGV, _redact_argv, HookType.AROUND)
    HookRegistry.register(_FROM_CLI_ARGS, _warn, HookType.AFTER)
