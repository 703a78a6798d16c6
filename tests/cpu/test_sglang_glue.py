"""Unit tests of the SGLang glue that need no SGLang: HF config class, strict weight loading,
pool geometry vs. allocated buffers, batch rows, the memory report and the serve launcher."""

from __future__ import annotations

import json
import pickle
import sys

import pytest
import torch
from torch import nn

sys.modules.setdefault("sglang", None)

from sglang_dsv41.config import preset  # noqa: E402
from sglang_dsv41.presets import tiny  # noqa: E402
from sglang_dsv41.sglang.buffers import RecordBuffers  # noqa: E402
from sglang_dsv41.sglang.context import build_rows  # noqa: E402
from sglang_dsv41.sglang.geometry import PoolGeometry  # noqa: E402
from sglang_dsv41.sglang.hf_config import ARCH, DeepseekV41HFConfig  # noqa: E402
from sglang_dsv41.sglang.weights import WeightLoadError, load_named  # noqa: E402
from sglang_dsv41.tools import kv_report, serve  # noqa: E402

if sys.modules.get("sglang", 0) is None:  # the imports above ran without SGLang; let
    del sys.modules["sglang"]  # later test modules (upstream parity) import the real one


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
    c.kv_cache_dtype_main = "fp8"  # what --json-model-override-args does
    assert c.dsv41().kv_cache_dtype_main == "fp8"


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


@pytest.mark.parametrize("name,ring", [("tiny", False), ("tiny", True), ("small", True)])
def test_geometry_matches_allocated_buffers(name, ring):
    cfg = preset(name)
    slots = 1024
    buf = RecordBuffers(cfg, slots, page_size=2, max_requests=3, decoder_ring=ring)
    g = PoolGeometry(cfg, ring)
    assert (g.ring_bytes_per_request() > 0) == ring
    per_slot = (buf.nbytes() - 4 * g.bytes_per_request()) / slots
    assert abs(per_slot - g.bytes_per_token()) < 1.0
    assert buf.source_layer_of(4) == cfg.source_layer_of(4) and buf.source_layer_of(0) == -1
    with pytest.raises(ValueError, match="page_size"):
        RecordBuffers(cfg, slots, page_size=1, max_requests=1)


def test_rows_select_keeps_suffixes():
    rows = build_rows([0, 5, 2], [4, 3, 2])
    assert rows.pos.tolist() == [0, 1, 2, 3, 5, 6, 7, 2, 3]
    kept = rows.select(rows.pos >= torch.tensor([2, 2, 2, 2, 6, 6, 6, 9, 9]))
    assert kept.ids.tolist() == [2, 3, 5, 6]
    assert kept.spans == [(0, 2), (2, 2), (4, 0)]


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
    assert kv_report.main(["--model", str(tmp_path), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    cfg = preset("tiny")
    assert rep["cpu_pool_bytes_per_token_slot"] == PoolGeometry(cfg, True).bytes_per_token()
    assert (
        rep["cpu_pool_ring_bytes_per_request"] == PoolGeometry(cfg, True).ring_bytes_per_request()
    )
    assert rep["cpu_pool_bytes_per_token_slot_replay_off"] == PoolGeometry(cfg).bytes_per_token()


def test_serve_command(monkeypatch, tmp_path):
    monkeypatch.setattr(serve, "ensure_tiny", lambda: str(tmp_path))
    monkeypatch.setattr(serve, "_has_cuda", lambda: False)
    cmd = serve.build_command(["--port", "3"])
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    assert cmd[3:5] == ["--model-path", str(tmp_path)]
    assert cmd[-3:] == ["--device", "cpu", "--sleep-on-idle"]
    cmd = serve.build_command(["--model-path", "X", "--device", "cuda"])
    assert "--sleep-on-idle" not in cmd and str(tmp_path) not in cmd


def test_engram_history_windows_match_whole_sequence():
    from sglang_dsv41.layers.engram import ngram_windows
    from sglang_dsv41.sglang.engram_history import EngramHistory

    g = torch.Generator().manual_seed(0)
    seqs = {
        "a": torch.randint(0, 50, (23,), generator=g),
        "b": torch.randint(0, 50, (9,), generator=g),
    }
    lookup = lambda rid, pos: [int(seqs[rid][p]) for p in pos]  # noqa: E731
    hist = EngramHistory(3)
    # a: chunks [0, 10), [10, 17), decode 17, 18; b: radix hit at 4, then [4, 9)
    steps = [([("a", 0, 10)]), ([("a", 10, 7), ("b", 4, 5)]), ([("a", 17, 1)]), ([("a", 18, 1)])]
    for step in steps:
        rows = build_rows([p for _, p, _ in step], [n for _, _, n in step])
        ids = torch.cat([seqs[r][p : p + n] for r, p, n in step])
        rp = [0 if r == "a" else 1 for r, _, _ in step]
        tok, blk = hist.windows(rows, ids, rp, [r for r, _, _ in step], lookup)
        for b, (r, p, n) in enumerate(step):
            st, _ = rows.spans[b]
            want_t, want_b = ngram_windows(seqs[r], torch.arange(len(seqs[r])), 3)
            assert torch.equal(tok[st : st + n], want_t[p : p + n]), (r, p)
            assert torch.equal(blk[st : st + n], want_b[p : p + n]), (r, p)
