"""Unit tests of the SGLang glue: HF config class, strict weight loading, the served pool against
the memory report, and the serve launcher."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from torch import nn

from sglang_dsv41.config import preset
from sglang_dsv41.presets import tiny
from sglang_dsv41.serving.geometry import PoolGeometry
from sglang_dsv41.sglang.hf_config import ARCH, DeepseekV41HFConfig
from sglang_dsv41.tools import kv_report, serve
from sglang_dsv41.weights.named import WeightLoadError, load_named


def _released(values: dict) -> dict:
    top = {k: values[k] for k in ("architectures", "model_type", "torch_dtype")}
    text = {k: v for k, v in values.items() if k not in top}
    return {**top, "vision_n_layers": 0, "text_config": text}


def test_hf_config_keeps_arch_and_values():
    raw = _released(tiny())
    c = DeepseekV41HFConfig(**raw)
    assert c.architectures == [ARCH] and c.model_type == "deepseek_v41"
    assert c.vision_n_layers == 0 and c.num_key_value_heads == 1
    core = c.dsv41()
    want = preset("tiny").to_dict()
    assert {k: v for k, v in core.to_dict().items() if k != "vision_n_layers"} == want
    assert core.rope_scaling["factor"] == 4  # not rewritten by transformers' RoPE handling
    again = pickle.loads(pickle.dumps(c))
    assert again.dsv41().to_dict() == core.to_dict()
    assert DeepseekV41HFConfig(**c.to_dict()).dsv41().to_dict() == core.to_dict()


def test_hf_config_override_args_reach_core():
    c = DeepseekV41HFConfig(**_released(tiny()))
    first = c.dsv41()
    assert c.dsv41() is first  # parsed once, not on every call
    c.kv_cache_dtype_main = "fp8"  # what --json-model-override-args does
    assert c.dsv41().kv_cache_dtype_main == "fp8" and first.kv_cache_dtype_main == "fp4"
    assert c.dsv41() is c.dsv41() and "_dsv41_parsed" not in c.to_dict()


def test_hf_config_invalid_names_field_and_layer():
    raw = tiny()
    raw["kv_source_layer_ids"] = [1, 3, 7]
    with pytest.raises(ValueError, match="kv_source_layer_ids.*layer 7"):
        DeepseekV41HFConfig(**raw).dsv41()


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 2, bias=False)
        self.b = nn.Parameter(torch.zeros(4))


def test_load_named_exact_and_errors():
    m = _Tiny()
    w = {"a.weight": torch.randn(2, 3), "b": torch.randn(4)}
    assert load_named(m, w.items()) == {"a.weight", "b"}
    assert torch.equal(m.b.data, w["b"])
    with pytest.raises(WeightLoadError, match=r"missing tensors: \['b'\]"):
        load_named(_Tiny(), [("a.weight", w["a.weight"])])
    with pytest.raises(WeightLoadError, match=r"unexpected tensors: \['c'\]"):
        load_named(_Tiny(), list(w.items()) + [("c", torch.zeros(1))])
    with pytest.raises(WeightLoadError, match=r"a.weight: shape \(3, 2\), expected \(2, 3\)"):
        load_named(_Tiny(), [("a.weight", torch.zeros(3, 2)), ("b", w["b"])])


@pytest.mark.parametrize("replay", [False, True])
def test_served_pool_allocates_what_kv_report_says(replay):
    """DSV41KVPool (the SGLang pool) holds exactly the bytes of kv_report's calculator."""
    from sglang_dsv41.sglang.options import ServingOptions
    from sglang_dsv41.sglang.pool import DSV41KVPool

    cfg = preset("tiny")
    pool = DSV41KVPool(ServingOptions(cfg, replay), 4096, 700, 2, 9, context_len=4100)
    cap = kv_report.capacity(PoolGeometry(cfg, replay), 1 << 30, 9, 256, 4100, 2)
    assert pool.nbytes() == PoolGeometry(cfg, replay).buffer_bytes(4096, 700, 2, 9)
    assert pool.get_kv_size_bytes() == pool.nbytes()
    assert cap["buffer_bytes"] == PoolGeometry(cfg, replay).buffer_bytes(
        cap["full_slots"], cap["swa_slots"], 2, 9
    )
    pool.register_mapping(torch.arange(4096 + 3))
    assert pool.translate_loc_from_full_to_swa(torch.tensor([5, 9])).tolist() == [5, 9]
    rep = kv_report.report(cfg, replay)["pool"]
    assert rep["swa_slot_bytes"] * (700 + 2) == sum(b.nbytes for b in pool.swa if b is not None)


def test_kv_report_flash_890():
    rep = kv_report.report(preset("flash"))
    assert rep["global_bytes_per_token"] == 890.0
    assert rep["records"]["v4_record_bytes"] == 584
    assert rep["v4_global_bytes_per_token"] == 2.5 * (584 + 68)
    assert rep["swa_bytes_per_request"] == 528 * 128 * 40
    assert sum(r["global_bytes_per_token"] for r in rep["layers"]) == 890.0
    assert [r["layer"] for r in rep["layers"] if r["global_bytes_per_token"]] == [2, 8, 14, 20]


def test_kv_report_cli_json(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(_released(tiny())))
    assert (
        kv_report.main(
            [
                "--model",
                str(tmp_path),
                "--json",
                "--budget-gib",
                "0.01",
                "--requests",
                "4",
                "--context-len",
                "4096",
                "--page",
                "2",
            ]
        )
        == 0
    )
    rep = json.loads(capsys.readouterr().out)
    g = PoolGeometry(preset("tiny"), True)
    assert rep["pool"]["full_slot_bytes"] == g.global_bytes_per_token()
    assert rep["pool"]["ring_bytes_per_request"] == g.ring_bytes_per_request()
    cap = rep["pool_sizing"]
    assert cap["allocated_bytes"] <= 0.01 * 2**30 and cap["full_slots"] > 0


def test_serve_command(monkeypatch, tmp_path):
    monkeypatch.setattr(serve, "default_model", lambda: str(tmp_path))
    monkeypatch.setattr(serve, "ensure_tiny", lambda: "TINY_DIR")
    monkeypatch.setattr(serve, "_has_cuda", lambda: False)
    cmd = serve.build_command(["--port", "3"])
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    assert cmd[3:5] == ["--model-path", str(tmp_path)]
    assert cmd[-3:] == ["--device", "cpu", "--sleep-on-idle"]
    cmd = serve.build_command(["--model-path", "X", "--device", "cuda"])
    assert "--sleep-on-idle" not in cmd and str(tmp_path) not in cmd
    assert serve.build_command(["--model-path", "tiny"])[3:5] == ["--model-path", "TINY_DIR"]
    assert "--model-path=TINY_DIR" in serve.build_command(["--model-path=tiny"])


def test_attention_dtype_option_from_environment():
    """SGLANG_DSV41_ATTN_DTYPE: unset / empty -> the model's default, fp32 / bf16 (any case),
    anything else an error naming the variable and the choices."""
    from sglang_dsv41.sglang.options import ATTN_DTYPE_ENV, ServingOptions, attn_dtype

    assert attn_dtype("fp32", {}) is None and attn_dtype("bf16", {}) is torch.bfloat16
    assert attn_dtype("bf16", {ATTN_DTYPE_ENV: ""}) is torch.bfloat16
    assert attn_dtype("bf16", {ATTN_DTYPE_ENV: "FP32"}) is None
    assert attn_dtype("fp32", {ATTN_DTYPE_ENV: " bf16 "}) is torch.bfloat16
    with pytest.raises(ValueError, match=f"{ATTN_DTYPE_ENV}='fp16': one of fp32, bf16"):
        attn_dtype("fp32", {ATTN_DTYPE_ENV: "fp16"})
    cfg = preset("tiny")
    assert ServingOptions(cfg, False).attn_mode == "fp32"
    assert ServingOptions(cfg, False, torch.bfloat16).attn_mode == "bf16"


def test_replay_option_follows_the_config_rule():
    """Replay is on by default where the config allows it (`DeepseekV41Config.replay_error`),
    off where it does not; the floor is the config's."""
    from sglang_dsv41.config import DeepseekV41Config
    from sglang_dsv41.sglang.options import ServingOptions

    cfg = preset("tiny")
    on = ServingOptions.from_server(cfg)
    assert on.replay and on.replay_floor(300) == cfg.replay_floor(300) == 284
    assert on.replay_floor(300, wants_prompt_logprobs=True) == 0
    late = DeepseekV41Config.from_dict({**tiny(), "kv_source_layer_ids": [1, 3, 6, 8]})
    off = ServingOptions.from_server(late)
    assert not off.replay and off.replay_floor(300) == 0
