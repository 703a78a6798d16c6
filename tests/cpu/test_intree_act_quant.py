"""The oracle's activation-quantization switch against SGLang's FP8 linear activations.

SGLang quantizes a 32x32 UE8M0-block FP8 linear's input per token in groups of 32 with the
power-of-two scale 2^ceil(log2(amax / 448)) (layers/act_quant.py says where). The scale exponent
is compared with SGLang's own MXFP8 producer (its Triton kernel, run by the Triton interpreter
in a subprocess); the payload is e4m3 round-to-nearest-even, which the interpreter does not
reproduce (its float8 cast is not RNE), so the payload is checked against torch's RNE cast.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.layers.act_quant import act_scale_exponent, fake_quant_act_fp8
from sglang_dsv41.reference.act_quant import fp8_linear_names, quantize_fp8_linear_inputs
from sglang_dsv41.reference.model import ReferenceModel
from sglang_dsv41.weights.release_config import flash_mini_text_config


def _inputs(rows=40, k=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.logspace(-6, 4, k)  # 10 decades of groups
    x[5, 32:64] = 448 * 2.0**-3  # amax / 448 exactly a power of two
    x[6, 64:96] = 56.25  # the next bf16 above it
    return x.to(torch.bfloat16)


def test_groups_scales_and_payload():
    x = _inputs()
    y = fake_quant_act_fp8(x)
    assert y.dtype == x.dtype and y.shape == x.shape
    xg, yg = x.float().view(40, 8, 32), y.float().view(40, 8, 32)
    e = act_scale_exponent(xg.abs().amax(-1).clamp(min=1e-10))  # [40, 8]
    scale = torch.ldexp(torch.ones(40, 8, 1), e[..., None])
    want = (xg / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale
    assert torch.equal(yg, want.to(torch.bfloat16).float())
    assert int(e[5, 1]) == -3 and int(e[6, 2]) == -2  # 56 / 448 = 2^-3; a hair above -> 2^-2
    assert (yg.abs() <= 448 * scale).all()
    assert torch.equal(fake_quant_act_fp8(y), y)  # values on the grid stay put
    with pytest.raises(ValueError, match="multiple of 32"):
        fake_quant_act_fp8(torch.zeros(2, 40))


_SGLANG_MXFP8 = textwrap.dedent("""
    import sys, torch, triton
    sys.path.insert(0, "@TESTS@")
    from sglang.kernels.ops.quantization import mxfp8_swizzled_triton as mx
    from test_intree_act_quant import _inputs
    from sglang_dsv41.layers.act_quant import act_scale_exponent
    x = _inputs()
    rows, k = x.shape
    q, s = mx._alloc(rows, k, x.device)
    G, ncb = k // 32, triton.cdiv(k // 32, 4)
    grid = (triton.cdiv(rows, 32), triton.cdiv(G, 8))
    mx._mxfp8_quant_kernel[grid](x, q, s, rows, k, G, ncb, x.stride(0), BLOCK_R=32, G=8)
    r, c = torch.arange(rows)[:, None], torch.arange(G)[None, :]
    off = ((r // 128) * ncb + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    theirs = s[off].to(torch.int32) - 127
    amax = x.float().view(rows, G, 32).abs().amax(-1)
    ours = act_scale_exponent(amax.clamp(min=1e-10))
    nz = amax > 0
    assert nz.all(), "the inputs have no all-zero group"
    assert torch.equal(ours, theirs), (ours != theirs).nonzero()[:5]
    print("SCALES_OK", int(nz.sum()))
""")


def test_scale_exponents_equal_sglang_mxfp8_producer():
    pytest.importorskip("sglang.kernels.ops.quantization.mxfp8_swizzled_triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    code = _SGLANG_MXFP8.replace("@TESTS@", os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert "SCALES_OK 320" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


def test_switch_hooks_the_fp8_linears_and_comes_off():
    torch.manual_seed(0)
    small = {  # flash-mini's widths and quantization, four layers: SWA, Full r2, Full r1, SWA
        "num_hidden_layers": 4,
        "compress_ratios": [0, 2, 1, 0],
        "kv_source_layer_ids": [1, 2],
        "index_source_layer_ids": [1, 2],
        "candidate_source_layer_id": -1,
        "engram_layer_ids": [],
        "engram_num_embeddings": [],
    }
    cfg = DeepseekV41Config.from_dict({**flash_mini_text_config(), **small})
    model = ReferenceModel(cfg).eval()
    names = fp8_linear_names(model)
    per_layer = {"attn.wq_a", "attn.wkv", "attn.wq_b", "attn.wo_b"} | {
        f"ffn.shared_experts.w{j}" for j in (1, 2, 3)
    }
    want = {f"layers.{i}.{n}" for i in range(4) for n in per_layer}
    want |= {f"layers.{i}.attn.indexer.wq_b" for i in (1, 2)}
    assert set(names) == want
    ids = torch.randint(2, cfg.vocab_size, (40,))
    plain = model.forward(ids)
    handles = quantize_fp8_linear_inputs(model)
    quant = model.forward(ids)
    for h in handles:
        h.remove()
    assert torch.equal(model.forward(ids), plain)
    diff = (quant - plain).abs().max()
    assert 0 < diff < 0.2 * plain.abs().max(), diff
