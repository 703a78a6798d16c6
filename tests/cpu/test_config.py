"""DeepseekV41Config: derived roles, sources, and validation messages naming field and layer."""

import copy
import json

import pytest

from sglang_dsv41.config import FULL, REINDEX, REUSE, SWA, ConfigError, DeepseekV41Config
from sglang_dsv41.presets import flash, tiny


def test_flash_roles_match_design():
    cfg = DeepseekV41Config.from_dict(flash())
    roles = cfg.roles()
    assert roles[0] == roles[1] == SWA
    assert [i for i, r in enumerate(roles) if r == FULL] == [2, 8, 14, 20]
    assert [i for i, r in enumerate(roles) if r == REINDEX] == [24, 28, 32, 36]
    assert roles.count(REUSE) == 40 - 2 - 4 - 4
    assert [cfg.source_layer_of(i) for i in (3, 7, 9, 19, 21, 39)] == [2, 2, 8, 14, 20, 20]
    assert [cfg.index_source_of(i) for i in (3, 21, 24, 27, 39)] == [2, 20, 24, 24, 36]
    assert cfg.uses_candidates(24) and not cfg.uses_candidates(20) and not cfg.uses_candidates(8)
    assert cfg.source_layer_of(0) == -1


def test_tiny_has_every_role():
    cfg = DeepseekV41Config.from_dict(tiny())
    roles = cfg.roles()
    assert {SWA, FULL, REINDEX, REUSE} <= set(roles)
    enc_full = [i for i in cfg.kv_source_layer_ids if i < cfg.decoder_start]
    assert len(enc_full) >= 2 and roles.count(REINDEX) >= 2
    assert {2, 1} <= set(cfg.compress_ratios)
    pool = cfg.candidate_topk_blocks * cfg.candidate_block_size
    assert cfg.sliding_window < 64 and cfg.index_topk < 64 // 2 and pool < 64
    assert cfg.candidate_topk_blocks > cfg.index_topk


def test_release_layout_with_text_config(tmp_path):
    released = {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "text_config": flash(),
        "vision_config": {"hidden_size": 1024},
        "quantization_config": {"quant_method": "fp8"},
    }
    (tmp_path / "config.json").write_text(json.dumps(released))
    cfg = DeepseekV41Config.from_hf(tmp_path)
    assert cfg.num_hidden_layers == 40 and len(cfg.compress_ratios) == 43
    assert cfg.quantization_config == {"quant_method": "fp8"}
    assert cfg.extra["vision_config"] == {"hidden_size": 1024}


def _bad(**changes):
    d = copy.deepcopy(tiny())
    d.update(changes)
    with pytest.raises(ConfigError) as e:
        DeepseekV41Config.from_dict(d)
    return str(e.value)


@pytest.mark.parametrize(
    "changes, field, layer",
    [
        (
            dict(kv_source_layer_ids=[1, 3, 6, 8], index_source_layer_ids=[1, 3, 6, 10]),
            "kv_source_layer_ids",
            8,
        ),
        (
            dict(kv_source_layer_ids=[0, 1, 3, 6], index_source_layer_ids=[0, 1, 3, 6, 8, 10]),
            "kv_source_layer_ids",
            0,
        ),
        (dict(index_source_layer_ids=[1, 3, 6, 8, 12]), "index_source_layer_ids", 12),
        (dict(index_source_layer_ids=[1, 3, 6, 10, 8]), "index_source_layer_ids", 8),
        (dict(index_source_layer_ids=[1, 3, 6, 6, 8]), "index_source_layer_ids", 6),
        (dict(candidate_source_layer_id=8), "candidate_source_layer_id", 8),
        (dict(candidate_source_layer_id=3), "candidate_source_layer_id", 3),
        (dict(compress_ratios=[0, 2, 2, 2, 2, 2, 1, 1, 2, 1, 1, 1]), "compress_ratios", 8),
        (dict(compress_ratios=[0, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 3]), "compress_ratios", 11),
        (dict(compress_ratios=[0, 1, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1]), "kv_source_layer_ids", 2),
        (
            dict(kv_source_layer_ids=[3, 6], index_source_layer_ids=[3, 6, 8, 10]),
            "kv_source_layer_ids",
            1,
        ),
    ],
)
def test_validation_names_field_and_layer(changes, field, layer):
    msg = _bad(**changes)
    assert msg.startswith(field) and f"(layer {layer})" in msg, msg


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(o_groups=3), "o_groups"),
        (dict(qk_rope_head_dim=128), "qk_rope_head_dim"),
        (dict(index_topk=0), "index_topk"),
        (dict(sliding_window=0), "sliding_window"),
        (dict(head_dim=48), "head_dim"),
        (dict(compress_ratios=[0, 2]), "compress_ratios"),
        (dict(num_experts_per_tok=9), "num_experts_per_tok"),
        (dict(kv_cache_dtype_main="fp16"), "kv_cache_dtype_main"),
    ],
)
def test_validation_names_field(changes, field):
    assert _bad(**changes).startswith(field)


def _engram(**changes):
    d = copy.deepcopy(tiny())
    d.update(
        {
            "engram_layer_ids": [1, 7],
            "engram_num_embeddings": [97, 101],
            "engram_max_ngram_size": 3,
            "engram_n_heads": 2,
            "engram_head_dim": 32,
            "engram_vocab_size": 61,
            "engram_compressed_vocab_size": 500,
        }
    )
    d.update(changes)
    return d


def test_engram_fields_valid():
    assert DeepseekV41Config.from_dict(_engram()).engram_layer_ids == [1, 7]


@pytest.mark.parametrize(
    "changes, field, layer",
    [
        (dict(engram_num_embeddings=[97]), "engram_num_embeddings", None),
        (dict(engram_num_embeddings=[97, 0]), "engram_num_embeddings", 7),
        (dict(engram_max_ngram_size=1), "engram_max_ngram_size", 1),
        (dict(engram_head_dim=0), "engram_head_dim", 1),
        (dict(engram_n_heads=0), "engram_n_heads", 1),
        (dict(engram_layer_ids=[7, 1]), "engram_layer_ids", 1),
        (dict(engram_layer_ids=[1, 12]), "engram_layer_ids", None),
    ],
)
def test_engram_validation(changes, field, layer):
    with pytest.raises(ConfigError) as e:
        DeepseekV41Config.from_dict(_engram(**changes))
    msg = str(e.value)
    assert msg.startswith(field), msg
    if layer is not None:
        assert f"(layer {layer})" in msg, msg


def _late_decoder_source() -> DeepseekV41Config:
    """tiny with a second decoder kv source (layer 8, after the first decoder layer 6)."""
    return DeepseekV41Config.from_dict({**tiny(), "kv_source_layer_ids": [1, 3, 6, 8]})


def _encoder_sources_only() -> DeepseekV41Config:
    """tiny whose last kv source (layer 5, ratio 1) is before the first decoder layer 6."""
    ratios = tiny()["compress_ratios"]
    return DeepseekV41Config.from_dict(
        {
            **tiny(),
            "compress_ratios": ratios[:5] + [1] + ratios[6:],
            "kv_source_layer_ids": [1, 3, 5],
            "index_source_layer_ids": [1, 3, 5, 8, 10],
            "candidate_source_layer_id": 5,
        }
    )


def test_replay_rule():
    """Replay needs every kv source at or before the first decoder layer; a layer loop whose tail
    starts at the last kv source (SGLang's in-tree loop) needs that source to be the first
    decoder layer itself."""
    cfg = DeepseekV41Config.from_dict(tiny())
    assert cfg.kv_source_layer_ids[-1] == cfg.decoder_start == 6
    assert cfg.replay_error() is None and cfg.replay_error(tail_at_last_kv_source=True) is None
    late = _late_decoder_source()
    for strict in (False, True):
        err = late.replay_error(tail_at_last_kv_source=strict)
        assert isinstance(err, ConfigError)
        assert "kv_source_layer_ids (layer 8)" in str(err) and "decoder layer 6" in str(err)
    early = _encoder_sources_only()
    assert early.decoder_start == 6 and early.replay_error() is None
    err = early.replay_error(tail_at_last_kv_source=True)
    assert isinstance(err, ConfigError) and "last kv source is layer 5" in str(err)


@pytest.mark.parametrize("prompt, floor", [(0, 0), (10, 0), (16, 0), (17, 1), (300, 284)])
def test_replay_floor(prompt, floor):
    cfg = DeepseekV41Config.from_dict(tiny())
    assert cfg.sliding_window == 16 and cfg.replay_floor(prompt) == floor
