"""SGLANG_DSV41_PLUGIN=off leaves the plugin out of one launch; unset, SGLang loads it.

SGLang loads every `sglang.srt.plugins` entry point through `load_plugins()` in each of its
processes; each check runs that in a fresh interpreter (the registries are process-global) and
reads what SGLang's registries then hold for `DeepseekV41ForCausalLM` / `deepseek_v41`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sglang_dsv41.plugin_switch import SWITCH_ENV, plugin_enabled

PROBE = """
import json
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.models.registry import ModelRegistry
from sglang.srt.utils.hf_transformers import common
from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
cls = ModelRegistry.models.get("DeepseekV41ForCausalLM")
print(json.dumps({
    "model": None if cls is None else cls.__module__,
    "config": getattr(common._CONFIG_REGISTRY.get("deepseek_v41"), "__module__", None),
    "dsv41_backend": "dsv41" in ATTENTION_BACKENDS,
}))
"""


def _probe(value):
    env = {k: v for k, v in os.environ.items() if k not in (SWITCH_ENV, "SGLANG_PLUGINS")}
    if value is not None:
        env[SWITCH_ENV] = value
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_switch_values():
    assert plugin_enabled({}) and plugin_enabled({SWITCH_ENV: "on"})
    for off in ("off", "OFF", "0", "false", "no", " Off "):
        assert not plugin_enabled({SWITCH_ENV: off}), off


@pytest.mark.parametrize("value", [None, "off"])
def test_sglang_loads_the_plugin_unless_switched_off(value):
    pytest.importorskip("sglang.srt.plugins")
    got, err = _probe(value)
    if value is None:
        assert got["model"].startswith("sglang_dsv41.") and got["dsv41_backend"]
        assert got["config"].startswith("sglang_dsv41.")
    else:
        assert not (got["model"] or "").startswith("sglang_dsv41.")
        assert not (got["config"] or "").startswith("sglang_dsv41.")
        assert not got["dsv41_backend"]
        assert f"{SWITCH_ENV}=off, plugin left out" in err
