"""This plugin's server flags: the per-request caps (request_rules.Caps), parsed with SGLang's.

    flag                          environment                       default
    --dsv41-max-n N               SGLANG_DSV41_MAX_N                64 sequences per request
                                                                    (prompts x n)
    --dsv41-max-top-logprobs N    SGLANG_DSV41_MAX_TOP_LOGPROBS     20 per token
    --dsv41-max-request-bytes N   SGLANG_DSV41_MAX_REQUEST_BYTES    16 B per token of context,
                                                                    at least 1 MiB

SGLang has no registry for a plugin's flags; its parser is built by the static method
`ServerArgs.add_cli_args` (an AFTER hook adds these three there) and read back by
`ServerArgs.from_cli_args`, which keeps only its own fields (an AFTER hook moves these three into
the environment). The environment is the one home of the values: a flag overrides the variable,
and every process SGLang starts after parsing inherits it. `server_caps()` reads it once.
"""

from __future__ import annotations

import argparse
import functools
import os

from sglang_dsv41.request_rules import DEFAULT_MAX_N, DEFAULT_MAX_TOP_LOGPROBS, Caps

_ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
_FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"

# Caps field -> (flag, environment variable, help)
FLAGS = {
    "max_n": (
        "--dsv41-max-n",
        "SGLANG_DSV41_MAX_N",
        "sglang_dsv41: most sequences one request may fan out to (prompts x n); "
        f"default {DEFAULT_MAX_N}",
    ),
    "max_top_logprobs": (
        "--dsv41-max-top-logprobs",
        "SGLANG_DSV41_MAX_TOP_LOGPROBS",
        "sglang_dsv41: most top logprobs per token (top_logprobs_num, logprobs, top_logprobs); "
        f"default {DEFAULT_MAX_TOP_LOGPROBS}",
    ),
    "max_request_bytes": (
        "--dsv41-max-request-bytes",
        "SGLANG_DSV41_MAX_REQUEST_BYTES",
        "sglang_dsv41: most bytes of one request body, refused (413) before it is read; "
        "default 16 per token of context, at least 1 MiB",
    ),
}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def caps_from_env(env=None) -> Caps:
    """Caps from the environment (unset variables keep Caps' defaults); a value that is not a
    positive integer is an error naming the variable."""
    env = os.environ if env is None else env
    values = {}
    for field, (flag, var, _) in FLAGS.items():
        text = env.get(var)
        if text is None or text == "":
            continue
        try:
            values[field] = _positive_int(text)
        except argparse.ArgumentTypeError as e:
            raise ValueError(f"{var} (or {flag}) = {e}") from None
    return Caps(**values)


@functools.cache
def server_caps() -> Caps:
    """The server's caps, read from the environment once (after the flags were parsed)."""
    return caps_from_env()


def _add_flags(result, parser, *args, **kwargs):
    for field, (flag, var, help_text) in FLAGS.items():
        parser.add_argument(
            flag,
            dest=f"dsv41_{field}",
            type=_positive_int,
            default=None,
            help=f"{help_text} (environment {var})",
        )
    return result


def _flags_to_env(result, cls, args, *rest, **kwargs):
    for field, (_, var, _) in FLAGS.items():
        value = getattr(args, f"dsv41_{field}", None)
        if value is not None:
            os.environ[var] = str(value)
    caps_from_env()  # a bad environment value fails the start, not a request
    return result


def register_server_flags() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(_ADD_CLI_ARGS, _add_flags, HookType.AFTER)
    HookRegistry.register(_FROM_CLI_ARGS, _flags_to_env, HookType.AFTER)
