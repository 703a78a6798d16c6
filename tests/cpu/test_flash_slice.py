"""flash-slice: release layers at full width, their roles re-indexed onto the slice.

- its manifest, layer by layer, equals flash-shapes' for the release layer it copies (names
  under the slice's layer id, shapes, dtypes), Engram rows aside (cut, width kept); the
  embed, norm and head entries equal the release's;
- the role lists map as documented, every role is held, a selection whose decoder start is not
  the last kv source is refused with the flag named;
- the weights' random source gives the same bits in any chunking, pinned values (the GPU test
  checks CUDA against the same values);
- written at flash-mini widths: the files validate against the manifest, same seed same bytes,
  the oracle runs it, stock SGLang's config class and FP4 probe read it, and stock SGLang's
  in-tree `DeepseekV4ForCausalLM` (its own attention, no plugin) and our CUDA model both load
  every tensor into parameters equal to our loader's.
"""

from __future__ import annotations

import json

import pytest
import torch

from sglang_dsv41.config import FULL, REINDEX, REUSE, SWA, DeepseekV41Config
from sglang_dsv41.tools.counter_normal import counter_normal, tensor_key
from sglang_dsv41.tools.flash_slice import report
from sglang_dsv41.tools.release_checkpoint import flash_config
from sglang_dsv41.tools.slice_config import (
    RELEASE_LAYERS,
    SliceError,
    layer_table,
    missing_roles,
    slice_config,
    slice_text_config,
)
from sglang_dsv41.weights.release_config import flash_mini_text_config, flash_text_config
from sglang_dsv41.weights.release_manifest import release_manifest

ENGRAM_ROWS = ("engram.embed.weight", "engram.embed.scale")


def _mini_widths() -> dict:
    full, mini = flash_text_config(), flash_mini_text_config()
    return {
        k: v
        for k, v in mini.items()
        if full.get(k) != v and not k.startswith("engram_") and k != "num_hidden_layers"
    }


def _by_layer(manifest: dict, layer: int) -> dict:
    p = f"layers.{layer}."
    return {n[len(p) :]: v for n, v in manifest.items() if n.startswith(p)}


@pytest.fixture(scope="module")
def flash_manifest():
    return release_manifest(flash_config())


def test_manifest_equals_flash_shapes_layer_by_layer(flash_manifest):
    text = slice_text_config()
    cfg = DeepseekV41Config.from_dict(slice_config(text))
    got = release_manifest(cfg)
    assert cfg.num_hidden_layers == len(RELEASE_LAYERS) == 6
    for j, layer in enumerate(RELEASE_LAYERS):
        mine, theirs = _by_layer(got, j), _by_layer(flash_manifest, layer)
        assert set(mine) == set(theirs), (j, layer)
        for name, (shape, dtype) in mine.items():
            want_shape, want_dtype = theirs[name]
            assert dtype == want_dtype, (j, name)
            if name.endswith(ENGRAM_ROWS):
                assert shape[1:] == want_shape[1:] and shape[0] < want_shape[0], (j, name)
            else:
                assert shape == want_shape, (j, layer, name)
    top = {n: v for n, v in got.items() if not n.startswith("layers.")}
    assert top == {n: v for n, v in flash_manifest.items() if not n.startswith("layers.")}
    experts = {n for n in got if ".ffn.experts." in n and n.endswith("w1.weight")}
    assert len(experts) == 6 * 384
    rows = got["layers.0.engram.embed.weight"][0][0]
    assert rows == cfg.engram_num_embeddings[0] == 1_003_416
    assert got["layers.0.engram.embed.weight"][0][1] == 256


def test_roles_are_reindexed_and_all_held():
    cfg = DeepseekV41Config.from_dict(slice_config(slice_text_config()))
    assert cfg.kv_source_layer_ids == [1, 3]
    assert cfg.index_source_layer_ids == [1, 3, 5]
    assert cfg.candidate_source_layer_id == 3 == cfg.decoder_start
    assert cfg.engram_layer_ids == [0]
    assert cfg.roles() == [SWA, FULL, REUSE, FULL, REUSE, REINDEX]
    assert [cfg.ratio(j) for j in range(6)] == [0, 2, 2, 1, 1, 1]
    assert cfg.compress_ratios[6:] == [0, 0, 0]  # the MTP stages' entries, as released
    assert cfg.uses_candidates(5) and not cfg.uses_candidates(4)
    assert missing_roles(cfg) == []
    rows = layer_table(cfg, RELEASE_LAYERS)
    assert [r[1] for r in rows] == list(RELEASE_LAYERS)
    assert "decoder start" in rows[3][4] and "candidate pool" in rows[5][4]
    full = flash_config()
    for j, layer in enumerate(RELEASE_LAYERS):  # the same role as in the release
        assert cfg.role(j) == full.role(layer) and cfg.ratio(j) == full.ratio(layer)
    raw = slice_config(slice_text_config())
    assert raw["vision_n_layers"] == 0 and raw["quantization_config"]["weight_block_size"] == [
        32,
        32,
    ]


def test_bad_selections_are_refused_naming_the_flag():
    with pytest.raises(SliceError, match="--layers"):
        slice_text_config([1, 2, 3, 20, 21])  # decoder start 2 is not the last kv source
    with pytest.raises(SliceError, match="--layers"):
        slice_text_config([3, 2])
    eight = slice_text_config([0, 1, 2, 3, 20, 21, 24, 25])
    assert eight["num_hidden_layers"] == 8 and eight["candidate_source_layer_id"] == 4


def test_report_uses_the_byte_calculator():
    rep = report(slice_text_config(), 0.85, 139.8)
    assert 44 < rep["weights_gib"] < 45
    ours, v4 = rep["layouts"]["dsv41"], rep["layouts"]["v4"]
    assert ours["bytes_per_token"] == (288 + 68) / 2 + (288 + 68)  # ratio-2 and ratio-1 sources
    assert v4["bytes_per_token"] == (584 + 68) / 2 + (584 + 68)
    assert ours["tokens"] > 1.7 * v4["tokens"]


def test_counter_normal_is_chunk_free_and_pinned():
    key = tensor_key(0, "layers.0.attn.wq_a.weight")
    whole = counter_normal(key, 64, 96, "cpu")
    parts = torch.cat([counter_normal(key, 32, 96, "cpu", r) for r in (0, 32)])
    assert torch.equal(whole, parts)
    assert abs(float(whole.mean())) < 0.05 and abs(float(whole.std()) - 1) < 0.05
    assert not torch.equal(whole, counter_normal(key ^ 1, 64, 96, "cpu"))
    # pinned: a change of the hash changes every checkpoint's bytes (tests/gpu checks CUDA)
    assert tensor_key(0, "x") == 634768859
    assert counter_normal(tensor_key(0, "x"), 2, 3, "cpu").tolist() == PINNED


PINNED = [
    [-1.0382639169692993, 1.4389278888702393, -1.8007410764694214],
    [1.7198947668075562, -2.0410072803497314, -0.06472466140985489],
]
"""counter_normal(tensor_key(0, "x"), 2, 3): the same values on every device."""


@pytest.fixture(scope="module")
def mini_slice(tmp_path_factory):
    from sglang_dsv41.tools.slice_weights import write_flash_slice

    out = tmp_path_factory.mktemp("flash_slice_mini")
    return write_flash_slice(out, engram_vocab=61, widths=_mini_widths(), progress=False)


def test_mini_slice_files_validate_and_reproduce(mini_slice, tmp_path):
    from sglang_dsv41.tools.slice_weights import write_flash_slice
    from sglang_dsv41.weights.checkpoint import scan_checkpoint, validate_release

    cfg = DeepseekV41Config.from_hf(str(mini_slice))
    found, _ = scan_checkpoint(str(mini_slice))
    validate_release(found, cfg, str(mini_slice))
    index = json.loads((mini_slice / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(release_manifest(cfg))
    assert index["weight_map"]["layers.5.attn.wq_b.weight"] == "model-00007-of-00007.safetensors"
    again = write_flash_slice(tmp_path, engram_vocab=61, widths=_mini_widths(), progress=False)
    for f in sorted(mini_slice.glob("*.safetensors")):
        assert (again / f.name).read_bytes() == f.read_bytes(), f.name


def test_oracle_runs_the_mini_slice(mini_slice):
    from sglang_dsv41.reference import load_reference

    model = load_reference(str(mini_slice), torch.float32)
    logits = model.forward(torch.arange(2, 60))
    assert logits.shape[-1] == model.cfg.vocab_size and torch.isfinite(logits).all()


def test_stock_sglang_reads_the_config(mini_slice):
    pytest.importorskip("sglang.srt.configs.deepseek_v41")
    from sglang.srt.configs.deepseek_v4 import try_detect_fp4_experts
    from sglang.srt.configs.deepseek_v41 import DeepseekV41Config as StockConfig

    raw = json.loads((mini_slice / "config.json").read_text())
    stock = StockConfig(**raw)
    ours = DeepseekV41Config.from_hf(str(mini_slice))
    assert stock.architectures == ["DeepseekV4ForCausalLM"] and stock.vision_n_layers == 0
    for key in (
        "num_hidden_layers",
        "compress_ratios",
        "kv_source_layer_ids",
        "index_source_layer_ids",
        "candidate_source_layer_id",
        "engram_layer_ids",
        "engram_num_embeddings",
        "engram_vocab_size",
        "engram_compressed_vocab_size",
        "hc_mult",
    ):
        a, b = getattr(stock, key), getattr(ours, key)
        assert (list(a) if isinstance(a, (list, tuple)) else a) == b, key
    assert try_detect_fp4_experts(str(mini_slice)) is True


@pytest.fixture(scope="module")
def sglang_state(mini_slice):
    pytest.importorskip("sglang.srt.models.deepseek_v4")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from intree_cpu import init_sglang_cpu
    from sglang.srt.runtime_context import restore_context, snapshot_context

    from sglang_dsv41.sglang import options

    saved, served = snapshot_context(), options.served()
    init_sglang_cpu(mini_slice, port=29763)
    yield
    restore_context(saved)
    options.register_served(served)


def _stock_model(ckpt):
    from intree_cpu import cpu_build_shims
    from sglang.srt.configs.deepseek_v41 import DeepseekV41Config as StockConfig
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from sglang.srt.models import deepseek_v4 as intree

    raw = json.loads((ckpt / "config.json").read_text())
    quant = Fp8Config.from_config(raw["quantization_config"])  # as SGLang's loader sets it
    quant.is_fp4_experts = quant.is_dsv4_fp4_experts = True
    quant.dequant_fp4_to_fp8 = False
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with cpu_build_shims():
            return intree.DeepseekV4ForCausalLM(StockConfig(**raw), quant)
    finally:
        torch.set_default_dtype(dtype)


@pytest.mark.parametrize("side", ["stock", "ours"])
def test_both_models_load_every_tensor(mini_slice, sglang_state, side):
    from intree_cpu import build_cuda_model, load

    from sglang_dsv41.weights.checkpoint import load_release_state
    from sglang_dsv41.weights.intree import dense_view

    model = _stock_model(mini_slice) if side == "stock" else build_cuda_model(mini_slice)
    attn = type(model.model.layers[0].self_attn).__name__
    assert attn == ("MQALayer" if side == "stock" else "DSV41CudaAttention")
    load(model, mini_slice)
    cfg = DeepseekV41Config.from_hf(str(mini_slice))
    view, unread = dense_view(model, cfg)
    assert unread == []
    want = load_release_state(str(mini_slice), cfg, torch.float32)
    assert set(view) == set(want)
    for name, t in want.items():
        assert torch.equal(view[name], t.float()), name
