"""flash-slice with `--dspark`: a DSpark head in the release's formats, its stages' experts cut.

- sizes: the head at the release's widths with 16 routed experts per stage (the default) and at
  384 (the release's), from the manifest (what `--report` prints and the docs state);
- written at flash-mini widths with 4 of 8 experts per stage: the config declares the head and
  `dspark_n_routed_experts`, the files hold exactly the head's manifest (one shard per stage,
  after the layers), the text model's files are unchanged by the head, and the checkpoint
  validates for this package's loader;
- SGLang's `DeepseekV4ForCausalLMDSpark`, built on CPU from the slice's config (our in-tree
  conversion, SGLang's FP8 config with FP4 experts), loads every mtp.* tensor through its own
  `load_weights` into stages of 4 routed experts, every parameter written;
- our CUDA model (the DSpark target), built on CPU, loads the whole checkpoint, head included
  (its mtp.* tensors skipped), into parameters equal to our loader's, and answers what SGLang's
  DSpark worker asks of a target: aux capture at the head's target layers, `lm_head.weight`,
  the input embedding.
"""

from __future__ import annotations

import json

import pytest
import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.tools.flash_slice import report
from sglang_dsv41.tools.slice_config import DSPARK_EXPERTS, SliceError, slice_text_config
from sglang_dsv41.weights.dspark_manifest import dspark_release_tensors
from sglang_dsv41.weights.release_manifest import release_manifest

MINI_EXPERTS = 4


def _mini_widths() -> dict:
    from test_flash_slice import _mini_widths as widths

    return widths()


def test_head_sizes_at_release_widths():
    small = report(slice_text_config(dspark_experts=DSPARK_EXPERTS), 0.85, 139.8)
    full = report(slice_text_config(dspark_experts=384), 0.85, 139.8)
    plain = report(slice_text_config(), 0.85, 139.8)
    assert plain["dspark_gib"] == 0
    assert round(small["dspark_gib"], 2) == 1.69 and round(full["dspark_gib"], 2) == 21.03
    assert round(small["weights_gib"], 2) == round(plain["weights_gib"] + 1.69, 2) == 45.87
    text = slice_text_config(dspark_experts=DSPARK_EXPERTS)
    assert text["dspark_n_routed_experts"] == 16 and text["dspark_target_layer_ids"] == [1, 3, 4]
    assert "dspark_n_routed_experts" not in slice_text_config(dspark_experts=384)
    with pytest.raises(SliceError, match="--dspark-experts 3"):
        slice_text_config(dspark_experts=3)


@pytest.fixture(scope="module")
def dspark_slice(tmp_path_factory):
    from sglang_dsv41.tools.slice_weights import write_flash_slice

    out = tmp_path_factory.mktemp("flash_slice_dspark")
    return write_flash_slice(
        out, engram_vocab=61, widths=_mini_widths(), progress=False, dspark_experts=MINI_EXPERTS
    )


def test_slice_holds_the_head(dspark_slice, tmp_path):
    from sglang_dsv41.tools.slice_weights import write_flash_slice
    from sglang_dsv41.weights.checkpoint import scan_checkpoint, validate_release

    cfg = DeepseekV41Config.from_hf(str(dspark_slice))
    assert cfg.extra["dspark_n_routed_experts"] == MINI_EXPERTS
    found, _ = scan_checkpoint(str(dspark_slice))
    validate_release(found, cfg, str(dspark_slice))
    index = json.loads((dspark_slice / "model.safetensors.index.json").read_text())
    names = set(index["weight_map"])
    head = dspark_release_tensors(cfg)
    assert {n for n in names if n.startswith("mtp.")} == set(head)
    assert names - set(head) == set(release_manifest(cfg))
    assert index["weight_map"]["mtp.2.markov_head.head.weight"] == (
        "model-00010-of-00010.safetensors"
    )
    assert index["weight_map"]["mtp.0.ffn.gate.weight"] == "model-00008-of-00010.safetensors"
    plain = write_flash_slice(tmp_path, engram_vocab=61, widths=_mini_widths(), progress=False)
    for j in range(7):  # the text model's shards: the same bytes with or without a head
        name = f"model-{j + 1:05d}-of-00007.safetensors"
        with_head = f"model-{j + 1:05d}-of-00010.safetensors"
        assert (plain / name).read_bytes() == (dspark_slice / with_head).read_bytes(), name


@pytest.fixture(scope="module")
def sglang_state(dspark_slice):
    pytest.importorskip("sglang.srt.models.deepseek_v4_dspark")
    from intree_cpu import init_sglang_cpu
    from sglang.srt.runtime_context import restore_context, snapshot_context

    from sglang_dsv41.sglang import options

    saved, served = snapshot_context(), options.served()
    init_sglang_cpu(dspark_slice, port=29767)
    yield
    restore_context(saved)
    options.register_served(served)


def test_sglang_loads_the_slice_head(dspark_slice, sglang_state):
    import sglang.srt.models.deepseek_v4_dspark as ds
    from test_dspark_manifest import build_draft, load_head

    from sglang_dsv41.sglang.intree_config import intree_config, intree_quant_config

    cfg = DeepseekV41Config.from_hf(str(dspark_slice))
    model = build_draft(
        ds.DeepseekV4ForCausalLMDSpark,
        intree_config(cfg),
        intree_quant_config(cfg),
        torch.bfloat16,
    )
    unwritten, warnings = load_head(model, dspark_slice)
    assert unwritten == [] and warnings == []
    assert len(model.stages) == 3
    assert all(s.mlp.experts.num_experts == MINI_EXPERTS for s in model.stages)


def test_our_target_loads_the_slice_and_captures(dspark_slice, sglang_state):
    from intree_cpu import build_cuda_model, load

    from sglang_dsv41.weights.checkpoint import load_release_state
    from sglang_dsv41.weights.dspark_manifest import DSparkHead
    from sglang_dsv41.weights.intree import dense_view

    cfg = DeepseekV41Config.from_hf(str(dspark_slice))
    model = build_cuda_model(dspark_slice)
    load(model, dspark_slice)  # every stored tensor, the head's included
    view, unread = dense_view(model, cfg)
    want = load_release_state(str(dspark_slice), cfg, torch.float32)
    assert unread == [] and set(view) == set(want)
    assert all(torch.equal(view[n], t.float()) for n, t in want.items())
    layers = list(DSparkHead.of(cfg).target_layer_ids)
    model.set_dspark_layers_to_capture(layers)  # what SGLang's model runner calls for DSPARK
    assert model.capture_aux_hidden_states and model.model.dspark_layers_to_capture == layers
    assert model.lm_head.weight.shape[0] == cfg.vocab_size
    assert model.get_input_embeddings().weight.shape == (cfg.vocab_size, cfg.hidden_size)
