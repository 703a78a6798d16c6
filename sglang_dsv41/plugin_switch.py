"""The switch that leaves the plugin out of one launch: `SGLANG_DSV41_PLUGIN=off` (or 0 / false /
no, any case) in that launch's environment. Read by the entry point (`sglang/plugin.py`) in every
process, and set by the tools that start a stock server beside ours (`tools/head_to_head.py`);
it lives outside `sglang/` so those tools import without SGLang."""

from __future__ import annotations

import os
from collections.abc import Mapping

SWITCH_ENV = "SGLANG_DSV41_PLUGIN"
OFF_VALUES = ("off", "0", "false", "no")


def plugin_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """False when SWITCH_ENV says off; anything else, or unset, is on."""
    environ = os.environ if environ is None else environ
    return environ.get(SWITCH_ENV, "on").strip().lower() not in OFF_VALUES
