"""The full-size released tensor manifest (docs/design.md 2.7) and the load-time validator."""

import json
import struct

import pytest
import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.weights.checkpoint import (
    WeightFormatError,
    manifest_problems,
    read_header,
    validate_release,
)
from sglang_dsv41.weights.release_config import (
    flash_text_config,
    flash_vision_config,
    release_config,
)
from sglang_dsv41.weights.release_manifest import (
    is_skipped,
    manifest_bytes,
    release_kind,
    release_manifest,
)

E4M3, UE8M0, I8, BF16, F32 = (
    torch.float8_e4m3fn,
    torch.float8_e8m0fnu,
    torch.int8,
    torch.bfloat16,
    torch.float32,
)


@pytest.fixture(scope="module")
def flash_cfg():
    return DeepseekV41Config.from_dict(release_config(flash_text_config(), flash_vision_config()))


@pytest.fixture(scope="module")
def manifest(flash_cfg):
    return release_manifest(flash_cfg)


def test_released_config_parses(flash_cfg):
    c = flash_cfg
    assert (c.num_hidden_layers, c.hidden_size, c.vocab_size) == (40, 5120, 129280)
    assert len(c.compress_ratios) == 43 and c.compress_ratios[40:] == [0, 0, 0]
    assert c.quantization_config["weight_block_size"] == [32, 32]
    assert c.hc_mult == 4 and c.engram_layer_ids == [1, 14] and c.rms_norm_eps == 1e-20
    assert "vision_config" in c.extra


# (name, shape, dtype) facts of docs/design.md 2.7 and docs/release_format.md, one a row:
# the name, the shape (sizes joined by "x"), the dtype (a name of DTYPES)
DTYPES = dict(E4M3=E4M3, UE8M0=UE8M0, I8=I8, BF16=BF16, F32=F32)
_FACTS_TABLE = """
layers.5.attn.wq_a.weight                       1280x5120  E4M3
layers.5.attn.wq_a.scale                           40x160  UE8M0
layers.5.attn.wq_b.weight                      32768x1280  E4M3
layers.5.attn.wkv.weight                         512x5120  E4M3
layers.5.attn.wo_a.weight                       8192x4096  E4M3
layers.5.attn.wo_a.scale                          256x128  UE8M0
layers.5.attn.wo_b.weight                       5120x8192  E4M3
layers.5.attn.wo_b.scale                          160x256  UE8M0
layers.5.attn.attn_sink                                64  F32
layers.5.attn.q_norm.weight                          1280  BF16
layers.2.attn.compressor.wkv.weight              512x5120  BF16
layers.2.attn.compressor.wgate.weight            512x5120  BF16
layers.20.attn.compressor.norm.weight                 512  BF16
layers.2.attn.indexer.wk.weight                   128x512  BF16
layers.2.attn.indexer.k_norm.weight                   128  BF16
layers.24.attn.indexer.wq_b.weight              4096x1280  E4M3
layers.24.attn.indexer.weights_proj.weight        32x5120  BF16
layers.7.ffn.gate.weight                         384x5120  BF16
layers.7.ffn.gate.bias                                384  F32
layers.7.ffn.gate.bias_vl                             384  F32
layers.7.ffn.experts.383.w1.weight              2304x2560  I8
layers.7.ffn.experts.383.w1.scale                2304x160  UE8M0
layers.7.ffn.experts.0.w3.weight                2304x2560  I8
layers.7.ffn.experts.0.w2.weight                5120x1152  I8
layers.7.ffn.experts.0.w2.scale                   5120x72  UE8M0
layers.7.ffn.shared_experts.w1.weight           2304x5120  E4M3
layers.7.ffn.shared_experts.w2.scale               160x72  UE8M0
layers.9.hc_attn_fn                              24x20480  F32
layers.9.hc_ffn_base                                   24  F32
layers.9.hc_ffn_scale                                   3  F32
layers.9.attn_norm.weight                            5120  BF16
layers.1.engram.embed.weight                384006168x256  E4M3
layers.1.engram.embed.scale                   384006168x8  UE8M0
layers.14.engram.wkv.weight                    25600x6144  E4M3
layers.14.engram.q_weight                          4x5120  BF16
embed.weight                                  129280x5120  BF16
head.weight                                   129280x5120  BF16
norm.weight                                          5120  BF16
"""
FACTS = [
    (name, tuple(int(n) for n in shape.split("x")), DTYPES[dtype])
    for name, shape, dtype in map(str.split, _FACTS_TABLE.strip().splitlines())
]


@pytest.mark.parametrize("name,shape,dtype", FACTS, ids=[f[0] for f in FACTS])
def test_full_size_facts(manifest, name, shape, dtype):
    assert manifest[name] == (shape, dtype)


def test_full_size_name_set(manifest):
    layers = {n.split(".")[1] for n in manifest if n.startswith("layers.")}
    assert layers == {str(i) for i in range(40)}
    assert sum(n.endswith(".ffn.experts.0.w1.weight") for n in manifest) == 40
    assert sum(".experts." in n for n in manifest) == 40 * 384 * 6
    assert {n.split(".")[1] for n in manifest if ".engram." in n} == {"1", "14"}
    assert sum(".compressor.wgate." in n for n in manifest) == 3  # ratio-2 Full: 2, 8, 14
    assert sum(".indexer.wq_b.weight" in n for n in manifest) == 8
    assert sum(".indexer.wk.weight" in n for n in manifest) == 4
    assert not any(n.startswith(("hc_head", "mtp.", "vision.")) or "tid2eid" in n for n in manifest)
    for n, (_shape, dtype) in manifest.items():  # every quantized weight has its scale
        if dtype in (E4M3, I8):
            assert manifest[n[: -len("weight")] + "scale"][1] == UE8M0
    assert len(manifest) == 93418
    gib = manifest_bytes(manifest) / 2**30
    assert 460 < gib < 475, gib  # text model; vision and the 3 MTP stages are not listed


def test_kinds():
    assert release_kind("layers.3.ffn.experts.12.w2.weight") == "fp4"
    assert release_kind("layers.3.ffn.shared_experts.w2.weight") == "fp8"
    assert release_kind("layers.3.attn.compressor.wkv.weight") == "bf16"
    assert release_kind("layers.3.attn.indexer.wq_b.weight") == "fp8"
    assert release_kind("layers.3.attn.indexer.wk.weight") == "bf16"
    assert is_skipped("mtp.0.e_proj.weight") and is_skipped("image_newline")
    assert not is_skipped("layers.0.attn.wkv.weight")


def test_validator_names_each_bad_tensor(flash_cfg, manifest):
    found = dict(manifest)
    found["vision.blocks.0.attn.wqkv.weight"] = ((3072, 1024), BF16)  # skipped, fine
    found["mtp.0.e_proj.weight"] = ((5120, 5120), E4M3)
    assert validate_release(found, flash_cfg) == 2
    found["layers.3.attn.wo_a.weight"] = ((8192, 4096), BF16)  # wrong dtype
    found["layers.7.ffn.experts.5.w2.scale"] = ((5120, 36), UE8M0)  # wrong shape
    del found["layers.14.engram.q_weight"]  # missing
    found["layers.2.attn.wq_c.weight"] = ((1, 1), BF16)  # unknown name
    with pytest.raises(WeightFormatError) as e:
        validate_release(found, flash_cfg, "ckpt")
    msg = str(e.value)
    for bad in (
        "layers.3.attn.wo_a.weight: dtype torch.bfloat16",
        "layers.7.ffn.experts.5.w2.scale: shape [5120, 36], expected [5120, 72]",
        "layers.14.engram.q_weight: missing",
        "layers.2.attn.wq_c.weight: unexpected",
    ):
        assert bad in msg
    assert "4 tensor problem" in msg
    assert manifest_problems(manifest, manifest) == []


def test_header_reader_without_data(tmp_path):
    """The validator reads safetensors headers only: a header-only file with full-size shapes
    (no data behind it) is enough to check names, dtypes and shapes."""
    header = {
        "layers.1.engram.embed.weight": {
            "dtype": "F8_E4M3",
            "shape": [384006168, 256],
            "data_offsets": [0, 98305579008],
        },
        "layers.1.engram.embed.scale": {
            "dtype": "F8_E8M0",
            "shape": [384006168, 8],
            "data_offsets": [98305579008, 101377628352],
        },
    }
    raw = json.dumps(header).encode()
    p = tmp_path / "shard.safetensors"
    p.write_bytes(struct.pack("<Q", len(raw)) + raw)
    got = read_header(str(p))
    assert got["layers.1.engram.embed.weight"] == ((384006168, 256), E4M3)
    assert got["layers.1.engram.embed.scale"] == ((384006168, 8), UE8M0)
