"""SGLang's own ops on the V4.1 path, on the H200, each against a torch reference.

Run by `scripts/gpu_e2e/head_to_head.sh ops` with the carried SGLang 0.5.23 and torch-2.11 builds
of its kernel libraries (scripts/gpu_e2e/wheels-kernels.txt; the step records which library
functions these calls reached: the op census). The ops are reached the way the served model reaches
them: stock SGLang's in-tree `DeepseekV4ForCausalLM` is built on the GPU for a flash-slice at
reduced widths (every role, mHC, Engram, FP8 32x32 blocks, packed-FP4 experts; hidden 512, expert
width 256: SM90's FP4 runners take multiples of 128), loaded by its own `load_weights` and post-
processed by SGLang's loader (`postprocess_weights`: DeepGEMM / Marlin / flashinfer layouts), under
the MoE runner of DSV41_MOE_BACKEND (default marlin, as head_to_head.sh's profile) and the
environment of the run.
References are this package's dense fp32 weights (`load_release_state`) and math:

    FP8 block linears     module(x) vs fake_quant_act_fp8(x) @ W^T (SGLang's activation
                          quantization, per token and 32 features, UE8M0), rel. error <= 2e-2
    MoE block             mlp(x) (router, FP4 routed experts, shared expert) vs layers.ffn.MoE,
                          rel. error <= 5e-2 (bf16 activations, FP4 weights exact)
    mHC pre / post        hc_pre / hc_post (SGLang's dispatch) vs layers.mhc, 1e-3 / bf16
    RMSNorm               forward_cuda vs forward_native
    indexer logits        DeepGEMM's fp8_paged_mqa_logits (stock's V4 indexer on SM90, called
                          as SGLang calls it: FP8 keys with one fp32 scale per entry in pages of
                          64) vs layers.index_math.index_scores on the dequantized keys,
                          rel. error <= 1e-2 over the visible entries
The attention kernels of each side are checked elsewhere: ours by tests/gpu/test_sparse_attn.py
and friends, stock's FlashMLA path end to end by the agreement harness (tools/agreement.py).

DSV41_GPU_TEST_DEVICE=cpu dry-runs the build, the load and the references on CPU (every forward
of a CUDA kernel skips there).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

DEVICE = os.environ.get("DSV41_GPU_TEST_DEVICE", "cuda")
BACKEND = os.environ.get("DSV41_MOE_BACKEND", "marlin")
FP8_GEMM = os.environ.get("DSV41_FP8_GEMM_BACKEND", "auto")  # the profile's --fp8-gemm-backend
if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("needs CUDA (or DSV41_GPU_TEST_DEVICE=cpu)", allow_module_level=True)
pytest.importorskip("sglang.srt.models.deepseek_v4")

OP_WIDTHS = {
    "vocab_size": 1024,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "q_lora_rank": 256,
    "o_lora_rank": 256,
    "index_n_heads": 4,
    "index_topk": 64,
    "candidate_topk_blocks": 16,
    "n_routed_experts": 16,
    "moe_intermediate_size": 256,
    "max_position_embeddings": 65536,
}
FP8_MODULES = [  # in-tree module (layer 1: a Full layer) -> dense names, concatenated by rows
    ("self_attn.wq_b", ["attn.wq_b.weight"]),
    ("self_attn.wo_b", ["attn.wo_b.weight"]),
    ("self_attn.indexer.wq_b", ["attn.indexer.wq_b.weight"]),
    ("mlp.shared_experts.gate_up_proj", ["ffn.shared_experts.w1.weight",
                                         "ffn.shared_experts.w3.weight"]),
    ("mlp.shared_experts.down_proj", ["ffn.shared_experts.w2.weight"]),
]  # fmt: skip
needs_cuda = pytest.mark.skipif(DEVICE != "cuda", reason="a CUDA kernel's forward")


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp(min=1e-30))


def _publish(ckpt: Path) -> None:
    """SGLang's state for one rank on DEVICE, as its scheduler sets it up before a model."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.layers.moe.utils import initialize_moe_config
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29777")
    if not torch.distributed.is_initialized():
        parallel_state.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="nccl" if DEVICE == "cuda" else "gloo"
        )
    reset_context()
    kw = {"device": "cuda", "moe_runner_backend": BACKEND} if DEVICE == "cuda" else {}
    args = ServerArgs(
        model_path="dummy",
        tokenizer_path=str(ckpt),
        tp_size=1,
        fp8_gemm_runner_backend=FP8_GEMM,
        **kw,
    )
    publish(args, role="test", ranks=SpawnRanks(world_rank=0))
    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(backend="nccl" if DEVICE == "cuda" else "gloo")
    initialize_moe_config()
    initialize_fp8_gemm_config()  # as SGLang's scheduler does before it builds a model


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from sglang_dsv41.tools.slice_weights import write_flash_slice

    out = tmp_path_factory.mktemp("ops_slice")
    return write_flash_slice(out, engram_vocab=61, widths=OP_WIDTHS, progress=False)


@pytest.fixture(scope="module")
def model(ckpt):
    """Stock SGLang's in-tree model on DEVICE, loaded and post-processed by SGLang."""
    from sglang.srt.configs.deepseek_v41 import DeepseekV41Config as StockConfig
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from sglang.srt.model_loader.loader import DefaultModelLoader
    from sglang.srt.models import deepseek_v4 as intree

    _publish(ckpt)
    raw = json.loads((ckpt / "config.json").read_text())
    quant = Fp8Config.from_config(raw["quantization_config"])
    quant.is_fp4_experts = quant.is_dsv4_fp4_experts = True
    quant.dequant_fp4_to_fp8 = False
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(DEVICE):
            if DEVICE == "cpu":
                import sys

                sys.path.insert(0, str(Path(__file__).parents[1] / "cpu"))
                from intree_cpu import cpu_build_shims

                with cpu_build_shims():
                    m = intree.DeepseekV4ForCausalLM(StockConfig(**raw), quant)
            else:
                m = intree.DeepseekV4ForCausalLM(StockConfig(**raw), quant)
    finally:
        torch.set_default_dtype(dtype)
    from safetensors.torch import load_file

    m._mhc_prewarmed_at_load = DEVICE != "cuda"
    tensors = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        tensors.update(load_file(str(f), device=DEVICE))
    m.load_weights(iter(tensors.items()))
    if DEVICE == "cuda":
        DefaultModelLoader.postprocess_weights(m, torch.device(DEVICE))
    return m


@pytest.fixture(scope="module")
def dense(ckpt):
    from sglang_dsv41.config import DeepseekV41Config
    from sglang_dsv41.weights.checkpoint import load_release_state

    cfg = DeepseekV41Config.from_hf(str(ckpt))
    return cfg, {k: v.to(DEVICE) for k, v in load_release_state(str(ckpt), cfg).items()}


@needs_cuda
def test_libraries_load():
    import deep_gemm
    import flash_mla
    import sgl_kernel

    assert "sm90" in sgl_kernel.common_ops.__file__
    assert flash_mla is not None
    # torch-2.11 builds: sgl_kernel's ops are registered with a CUDA kernel, DeepGEMM binds
    # through tvm-ffi (no torch.ops registration)
    assert torch._C._dispatch_has_kernel_for_dispatch_key("sgl_kernel::rmsnorm", "CUDA")
    assert callable(deep_gemm.fp8_gemm_nt) and callable(deep_gemm.fp8_paged_mqa_logits)


@needs_cuda
@pytest.mark.parametrize("batch,heads", [(3, 64), (8, 32)])
def test_indexer_paged_logits(batch, heads):
    import deep_gemm

    from sglang_dsv41.layers.index_math import index_scores

    page, dim, pages_per_row = 64, 128, 9
    gen = torch.Generator(device="cuda").manual_seed(batch * 1000 + heads)
    lens = torch.randint(1, page * pages_per_row, (batch,), generator=gen, device="cuda")
    lens[0] = page * pages_per_row  # one row fills its pages
    n_pages = batch * pages_per_row + 5
    table = torch.randperm(n_pages, generator=gen, device="cuda")[: batch * pages_per_row]
    table = table.view(batch, pages_per_row).int()  # [B, pages]
    k = torch.randn(n_pages, page, dim, generator=gen, device="cuda")  # [P, 64, 128]
    k_scale = k.abs().amax(-1) / 448.0  # [P, 64] one fp32 scale per entry
    k_fp8 = (k / k_scale[..., None]).to(torch.float8_e4m3fn)
    cache = torch.empty(n_pages, page * (dim + 4), dtype=torch.uint8, device="cuda")
    cache[:, : page * dim] = k_fp8.view(torch.uint8).view(n_pages, -1)
    cache[:, page * dim :] = k_scale.contiguous().view(torch.uint8).view(n_pages, -1)
    cache = cache.view(n_pages, page, 1, dim + 4)
    q = torch.randn(batch, 1, heads, dim, generator=gen, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(batch, heads, generator=gen, device="cuda")
    lens2 = lens.int().unsqueeze(-1)  # [B, 1], as SGLang passes it
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens2, page, deep_gemm.get_num_sms())
    max_len = page * pages_per_row
    got = deep_gemm.fp8_paged_mqa_logits(q, cache, w, lens2, table, meta, max_len, False)
    assert got.shape[0] == batch and got.shape[1] >= max_len
    keys = (k_fp8.float() * k_scale[..., None])[table.long()].view(batch, max_len, dim)
    for b in range(batch):
        n = int(lens[b])
        want = index_scores(q[b].float(), w[b : b + 1], keys[b, :n])  # [1, n]
        assert rel_err(got[b : b + 1, :n], want) <= 1e-2, (b, n)


@pytest.mark.parametrize("module,names", FP8_MODULES, ids=[m for m, _ in FP8_MODULES])
def test_fp8_block_linear(model, dense, module, names):
    from sglang_dsv41.layers.act_quant import fake_quant_act_fp8

    cfg, w = dense
    mod = model.model.layers[1].get_submodule(module)
    assert type(mod.quant_method).__name__ == "Fp8LinearMethod", module
    weight = torch.cat([w[f"layers.1.{n}"] for n in names]).float()  # [N, K]
    x = torch.randn(37, weight.shape[1], device=DEVICE).bfloat16()
    want = fake_quant_act_fp8(x.float()) @ weight.T  # [37, N]
    if DEVICE != "cuda":
        pytest.skip("reference built; the FP8 GEMM runs on CUDA only")
    got = mod(x)[0]
    assert got.shape == want.shape and rel_err(got, want) <= 2e-2, (module, rel_err(got, want))


@needs_cuda
@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_moe_block(model, dense, tokens):
    from sglang_dsv41.layers.ffn import MoE

    cfg, w = dense
    with torch.device("meta"):
        ref = MoE(cfg)
    prefix = "layers.1.ffn."
    ref.load_state_dict({k[len(prefix) :]: v.float() for k, v in w.items()
                         if k.startswith(prefix)}, assign=True)  # fmt: skip
    x = (torch.randn(tokens, cfg.hidden_size, device=DEVICE) * 0.5).bfloat16()
    want = ref(x.float())
    got = model.model.layers[1].mlp(x)
    got = got[0] if isinstance(got, tuple) else got
    assert rel_err(got, want) <= 5e-2, rel_err(got, want)


@needs_cuda
@pytest.mark.parametrize("tokens", [1, 64, 1500])
def test_mhc_pre_post(model, dense, tokens):
    from sglang.kernels.ops.layernorm import mhc as sgl_mhc

    from sglang_dsv41.layers import mhc

    cfg, w = dense
    S, d = cfg.hc_mult, cfg.hidden_size
    p = "layers.2."
    fn, base, scale = (w[p + f"hc_attn_{k}"].float() for k in ("fn", "base", "scale"))
    H = torch.randn(tokens, S, d, device=DEVICE).bfloat16()
    pre, post, comb = mhc.hc_mix(
        H, fn, base, scale, iters=cfg.hc_sinkhorn_iters, hc_eps=cfg.hc_eps, rms_eps=cfg.rms_norm_eps
    )
    x_in, h_res, h_post, _ = sgl_mhc.hc_pre(
        H.view(tokens, S * d), fn, scale, base, S, cfg.rms_norm_eps, cfg.hc_eps,
        cfg.hc_sinkhorn_iters,
    )  # fmt: skip
    assert rel_err(h_post, post) <= 1e-3 and rel_err(h_res.view(tokens, S, S), comb) <= 1e-3
    assert rel_err(x_in, mhc.hc_collapse(H, pre)) <= 1e-2
    y = torch.randn(tokens, d, device=DEVICE).bfloat16()
    got = sgl_mhc.hc_post(y, H.view(tokens, S * d), h_post, h_res, S)
    assert rel_err(got.view(tokens, S, d), mhc.hc_post(y, H, post, comb)) <= 1e-2


@needs_cuda
def test_rmsnorm(model):
    norm = model.model.layers[0].input_layernorm
    x = torch.randn(33, norm.weight.shape[0], device=DEVICE).bfloat16()
    want = norm.forward_native(x.clone())
    got = norm(x.clone())
    got, want = (t[0] if isinstance(t, tuple) else t for t in (got, want))
    assert rel_err(got, want) <= 1e-2
