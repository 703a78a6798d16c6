"""flash-mini: a released-format checkpoint at reduced widths, loaded and run by the reference."""

import json
import logging
import re
import shutil

import pytest
import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.reference import load_reference
from sglang_dsv41.tools.release_checkpoint import SHARDS, flash_config, write_flash_mini
from sglang_dsv41.weights.checkpoint import (
    WeightFormatError,
    load_release_state,
    scan_checkpoint,
)
from sglang_dsv41.weights.quant import dequant_fp4_packed, dequant_fp8_block
from sglang_dsv41.weights.release_manifest import is_skipped, release_manifest


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    return write_flash_mini(tmp_path_factory.mktemp("flash_mini"))


@pytest.fixture(scope="module")
def model(mini):
    return load_reference(mini)


def test_config_layout(mini):
    raw = json.loads((mini / "config.json").read_text())
    assert set(raw) >= {
        "architectures",
        "model_type",
        "text_config",
        "vision_config",
        "quantization_config",
    }
    assert raw["quantization_config"] == {
        "quant_method": "fp8",
        "weight_block_size": [32, 32],
        "scale_fmt": "ue8m0",
        "expert_dtype": "fp4",
        "activation_scheme": "dynamic",
    }
    text = raw["text_config"]
    assert len(text["compress_ratios"]) == 43 and text["compress_ratios"][40:] == [0, 0, 0]
    full = flash_config()
    cfg = DeepseekV41Config.from_dict(raw)
    for k in (
        "num_hidden_layers",
        "compress_ratios",
        "kv_source_layer_ids",
        "index_source_layer_ids",
        "candidate_source_layer_id",
        "hc_mult",
        "hc_sinkhorn_iters",
        "engram_layer_ids",
        "engram_max_ngram_size",
        "scoring_func",
        "routed_scaling_factor",
        "swiglu_limit",
        "n_shared_experts",
        "rms_norm_eps",
        "num_nextn_predict_layers",
    ):
        assert getattr(cfg, k) == getattr(full, k), k
    assert cfg.roles() == full.roles()


def _generic(name: str) -> str:
    return re.sub(r"\.experts\.\d+\.", ".experts.E.", name)


def test_name_set_and_kinds_equal_the_release(mini):
    """Same names (expert ids aside: 8 instead of 384), dtypes and ranks as the full release;
    the headers equal release_manifest(cfg) exactly."""
    found, _ = scan_checkpoint(str(mini))
    cfg = DeepseekV41Config.from_hf(mini)
    text = {n: v for n, v in found.items() if not is_skipped(n)}
    assert text == {n: (tuple(s), d) for n, (s, d) in release_manifest(cfg).items()}
    full = release_manifest(flash_config())
    gen_full = {_generic(n): (len(s), d) for n, (s, d) in full.items()}
    gen_mini = {_generic(n): (len(s), d) for n, (s, d) in text.items()}
    assert gen_mini == gen_full
    assert sum(is_skipped(n) for n in found) > 0  # mtp / vision placeholders present


def test_loader_dequantizes_and_skips_with_one_line(mini, caplog):
    from safetensors.torch import load_file

    cfg = DeepseekV41Config.from_hf(mini)
    with caplog.at_level(logging.INFO, logger="sglang_dsv41.weights.checkpoint"):
        state = load_release_state(str(mini), cfg)
    lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(lines) == 1 and "mtp" in lines[0]
    raw = load_file(str(mini / SHARDS[0]))
    name = "layers.21.ffn.experts.5.w2.weight"
    torch.testing.assert_close(state[name], dequant_fp4_packed(raw[name], raw[name[:-6] + "scale"]))
    name = "layers.3.attn.wo_a.weight"
    torch.testing.assert_close(state[name], dequant_fp8_block(raw[name], raw[name[:-6] + "scale"]))
    assert state["layers.0.hc_attn_fn"].dtype == torch.float32
    assert not any(n.endswith((".scale", "bias_vl")) or is_skipped(n) for n in state)


def test_reference_runs_greedy_and_deterministic(model):
    ids = [0, 5, 17, 200, 3, 99, 45, 45, 45, 7, 300, 12, 8, 8, 401, 2, 33, 64, 128, 256]
    logits = model(torch.tensor(ids))
    assert logits.shape == (20, 512) and torch.isfinite(logits).all()
    assert logits[-1].std() > 0.1
    a = model.generate(ids, 3, replay=False)
    b = model.generate(ids, 3, replay=False)
    assert a == b and len(a) == 3
    assert model.engram_hasher is not None and model.cfg.engram_compressed_vocab_size < 512


def test_wrong_tensor_fails_naming_it(mini, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(mini, bad)
    shard = load_file(str(bad / SHARDS[0]))
    shard["layers.14.engram.wkv.scale"] = shard["layers.14.engram.wkv.scale"][:, :-1].clone()
    shard["layers.7.attn.wq_a.weight"] = shard["layers.7.attn.wq_a.weight"].to(torch.bfloat16)
    save_file(shard, str(bad / SHARDS[0]))
    with pytest.raises(WeightFormatError) as e:
        load_reference(bad)
    assert "layers.14.engram.wkv.scale: shape" in str(e.value)
    assert "layers.7.attn.wq_a.weight: dtype torch.bfloat16" in str(e.value)


def test_bounded_replay_runs_with_mhc(model):
    """Replay narrows the mHC state (streams and pre) to the decoder tail."""
    ids = torch.tensor(
        [0, 5, 17, 200, 3, 99, 45, 45, 45, 7, 300, 12, 8, 8, 401, 2, 33, 64, 128, 256]
    )
    F = model.replay_floor_for(len(ids), True)
    assert F == 4
    logits = model(ids, replay_floor=F)
    assert torch.isnan(logits[:F]).all() and torch.isfinite(logits[F:]).all()


def test_stream_loader_equals_directory_loader(mini):
    """The (name, tensor) stream form SGLang's load_weights sees, in any order."""
    from safetensors.torch import load_file

    from sglang_dsv41.weights.checkpoint import dense_weights_from_release

    cfg = DeepseekV41Config.from_hf(mini)
    items = [kv for f in SHARDS for kv in load_file(str(mini / f)).items()]
    streamed = dict(dense_weights_from_release(reversed(items), cfg))
    state = load_release_state(str(mini), cfg)
    assert streamed.keys() == state.keys()
    assert all(torch.equal(streamed[k], state[k].float()) for k in state)
    items[3] = (items[3][0], items[3][1][:1])
    with pytest.raises(WeightFormatError, match=re.escape(items[3][0])):
        dict(dense_weights_from_release(items, cfg))


def test_make_checkpoint_dispatch(tmp_path, capsys, mini):
    """`make_checkpoint --preset flash-shapes|flash-mini` reach the released-format tools."""
    from sglang_dsv41.tools.make_checkpoint import main

    assert main(["--preset", "flash-shapes"]) == 0
    assert "93418 tensors, 466.95 GiB" in capsys.readouterr().out
    assert main(["--preset", "flash-shapes", "--check", str(mini)]) == 1  # mini != full size
    assert "tensor problem" in capsys.readouterr().err
    out = tmp_path / "m"
    assert main(["--preset", "flash-mini", "--out", str(out)]) == 0
    assert (out / SHARDS[0]).read_bytes() == (mini / SHARDS[0]).read_bytes()  # same seed
