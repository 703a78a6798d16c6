"""SGLang's DSpark draft of a V4.1 checkpoint, this package's hooks installed (docs/speculative.md).

Each check runs in a fresh interpreter (`PROBE`) that does what a server process does first:
SGLang's `load_plugins()` (our registrations and HookRegistry hooks applied), then publishes the
server arguments SGLang resolves for the checkpoint on this CPU; the speculative leaves are then
set as SGLang's `_handle_dspark` resolves them for a checkpoint that bundles its head (DSPARK,
the draft path = the model path, verify width gamma + 1 = 6), since its argument resolution
refuses a CPU device (the one CUDA-only step replaced). On that state, SGLang's own functions:

- draft config: `ModelConfig.from_server_args(..., is_draft_model=True)` gives
  `DeepseekV4ForCausalLMDSpark` on SGLang's in-tree V4.1 config (hybrid SWA, V4 shapes, FP8
  with FP4 experts for the released format); without our hook (SGLang's method unwrapped) the
  architecture stays `DeepseekV41ForCausalLM`, the failure seen when the worker was first tried;
  `draft_is_deepseek_v4()` answers True (SGLang's own function unwrapped: False); the target's
  capture config counts 3 draft stages on the head's target layers;
- attention backends: the target runner `dsv41`, the draft runner `dsv4` (the DSpark worker's
  choice, `draft_is_deepseek_v4`), and without our hook the fallback `flashinfer`;
- pools (`KVCacheConfigurator` methods, the runner's fields set as a model runner sets them, at
  V4's attention geometry head_dim 512 / rope 64, which SGLang's V4 pool requires): SGLang's
  configurator choice for the target is ours, for the draft its DSV4 one; the target's pool is
  `DSV41KVPool` under SGLang's SWA allocator; the draft's is SGLang's `DeepSeekV4TokenToKVPool`
  (3 SWA-only layers, FP8 with --speculative-draft-kv-cache-dtype fp8_e4m3) over the target's
  SWA slots, sharing the target allocator's full -> SWA mapping;
- the draft model: the class SGLang's registry resolves from the draft config, its quantization
  config from SGLang's loader (`_get_quantization_config`), built on CPU and loaded from the
  checkpoint's mtp.* tensors through its own `load_weights`: every parameter written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sglang.srt.models.deepseek_v4_dspark")

HERE = Path(__file__).resolve().parent

PROBE = r"""
import json, sys
from types import SimpleNamespace as NS

sys.path.insert(0, sys.argv[3])
from sglang.srt.plugins import load_plugins

load_plugins()
import torch
from sglang.srt.configs.model_config import ModelConfig, is_deepseek_v4
from sglang.srt.runtime_context import SpawnRanks, publish
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.dspark_components import dspark_config
from sglang.srt.speculative.draft_worker_common import resolve_draft_worker_attention_backend
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

path, steps, out = sys.argv[1], sys.argv[2].split(","), {}
args = ServerArgs(
    model_path=path, device="cpu", page_size=256, max_running_requests=4,
    chunked_prefill_size=512, speculative_draft_kv_cache_dtype="fp8_e4m3",
)
ctx = publish(args, role="test", ranks=SpawnRanks(world_rank=0))
ctx.override(
    "_handle_dspark", speculative_algorithm="DSPARK",
    speculative_draft_model_path=path, speculative_num_draft_tokens=6,
)
algo = SpeculativeAlgorithm.from_string("DSPARK")
target = ModelConfig.from_server_args(args)
draft = ModelConfig.from_server_args(args, model_path=path, is_draft_model=True)
is_v4 = dspark_config.draft_is_deepseek_v4()

if "config" in steps:
    hooked = ModelConfig._config_draft_model
    ModelConfig._config_draft_model = hooked.__wrapped__
    try:
        stock = ModelConfig.from_server_args(args, model_path=path, is_draft_model=True)
    finally:
        ModelConfig._config_draft_model = hooked
    from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
        resolve_spec_aux_hidden_state_config,
    )

    aux = resolve_spec_aux_hidden_state_config(
        server_args=args, model_config=target, spec_algorithm=algo, is_draft_worker=False
    )
    out.update(
        target_arch=target.hf_config.architectures[0],
        draft_arch=draft.hf_config.architectures[0],
        stock_draft_arch=stock.hf_config.architectures[0],
        draft_config_class=type(draft.hf_config).__module__ + "." + type(draft.hf_config).__name__,
        draft_is_v4=is_v4,
        stock_draft_is_v4=dspark_config.draft_is_deepseek_v4.__wrapped__(),
        draft_v4_arch=draft.is_deepseek_v4_arch,
        draft_hybrid_swa=draft.is_hybrid_swa,
        draft_window=draft.window_size,
        draft_quantization=draft.quantization,
        draft_fp4_experts=draft.is_fp4_experts,
        draft_topk_group=draft.hf_config.topk_group,
        aux_stages=aux.dspark_num_stages,
        aux_target_layers=list(aux.dflash_target_layer_ids),
        aux_draft_arch=aux.draft_model_config.hf_config.architectures[0],
    )

if "backends" in steps:
    from sglang.srt.model_executor.model_runner_components.attention_backend_setup import (
        resolve_attention_backend_strs,
    )

    # the DSpark worker's choice for its draft runner (dspark_worker_v2: override when V4)
    chosen = dspark_config.DSV4_DRAFT_ATTENTION_BACKEND if is_v4 else None
    fallback = resolve_draft_worker_attention_backend(algo_label="DSPARK")
    t = resolve_attention_backend_strs(
        model_runner=NS(is_draft_worker=False, draft_attention_backend=None)
    )
    d = resolve_attention_backend_strs(
        model_runner=NS(is_draft_worker=True, draft_attention_backend=chosen or fallback)
    )
    out.update(target_backend=[t.prefill, t.decode], draft_backend=[d.prefill, d.decode],
               stock_draft_backend=fallback)

if "pools" in steps:
    from sglang.srt.mem_cache import kv_cache_dtype
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator, _PoolSizes
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.model_executor import pool_configurator as pc

    from sglang_dsv41.sglang.options import ServingOptions

    class Chosen:  # SGLang's DSV4 sizing needs a whole runner; record that it was chosen
        def __init__(self, kvc):
            self.kvc = kvc

    pc.DSV4PoolConfigurator = Chosen

    def runner_kvc(mc, is_draft, model, layers, allocator=None):
        # the fields a ModelRunner gives its KVCacheConfigurator (no CUDA)
        name, dtype = kv_cache_dtype.configure_kv_cache_dtype(
            server_args_kv_cache_dtype=args.kv_cache_dtype, model=model,
            model_dtype=torch.bfloat16, is_draft_worker=is_draft, is_dflash=True,
            speculative_draft_attention_backend="dsv4" if is_draft else None,
            speculative_draft_kv_cache_dtype="fp8_e4m3",
        )
        k = object.__new__(KVCacheConfigurator)
        for a, v in dict(
            device="cpu", gpu_id=0, model=model, model_config=mc, server_args=args,
            kv_cache_dtype=dtype, kv_cache_dtype_str=name or args.kv_cache_dtype,
            model_dtype=torch.bfloat16, page_size=256,
            sliding_window_size=getattr(mc, "window_size", None), spec_algorithm=algo,
            is_draft_worker=is_draft, is_hybrid_swa=mc.is_hybrid_swa, use_mla_backend=False,
            layer_info=NS(num_effective_layers=layers, start_layer=0, end_layer=layers,
                          is_hybrid_swa_mtp_draft=False, swa_attention_layer_ids=None),
            draft_model_idx=None, kv_shard_rank=None, kv_shard_size=1, kv_shard_spec=None,
            mambaish_config=None, is_hybrid_swa_mtp_draft=False, draft_swa_full_capacity=False,
            token_to_kv_pool_allocator=allocator, req_to_token_pool=None,
            memory_pool_config=None, pp_size=1,
        ).items():
            setattr(k, a, v)
        return k

    cfg = target.hf_config.dsv41()
    model = NS(options=ServingOptions.from_server(cfg))
    tk = runner_kvc(target, False, model, cfg.num_hidden_layers)
    req = ReqToTokenPool(size=4, max_context_len=4096, device="cpu", enable_memory_saver=False)
    conf = pc.create_memory_pool_configurator(tk)
    swa = conf.swa_slots(4, 256)
    sizes = _PoolSizes(
        max_total_num_tokens=4096, max_running_requests=4, full_max_total_num_tokens=4096,
        swa_max_total_num_tokens=swa, c4_max_total_num_tokens=0, c128_max_total_num_tokens=0,
        c4_state_pool_size=0, c128_state_pool_size=0, c4_state_dtype=None,
        c128_state_dtype=None,
    )
    tpool = tk._build_token_to_kv_pool(
        sizes=sizes, is_dsa_model=False, is_dsv4_model=is_deepseek_v4(target.hf_config),
        req_to_token_pool=req,
    )
    talloc = tk._build_token_to_kv_pool_allocator(
        sizes=sizes, token_to_kv_pool=tpool, is_dsv4_model=False, req_to_token_pool=req,
        token_to_kv_pool_allocator=None,
    )
    stages = len(draft.hf_config.dspark_target_layer_ids)
    dk = runner_kvc(draft, True, None, stages, talloc)
    dconf = pc.create_memory_pool_configurator(dk)
    dpool = dk._build_token_to_kv_pool(
        sizes=sizes, is_dsa_model=False, is_dsv4_model=is_deepseek_v4(draft.hf_config),
        req_to_token_pool=req,
    )
    dalloc = dk._build_token_to_kv_pool_allocator(
        sizes=sizes, token_to_kv_pool=dpool, is_dsv4_model=True, req_to_token_pool=req,
        token_to_kv_pool_allocator=talloc,
    )
    out.update(
        target_configurator=type(conf).__name__,
        draft_configurator=type(dconf).__name__,
        target_pool=type(tpool).__name__,
        target_allocator=type(talloc).__name__,
        target_kv_dtype=str(tk.kv_cache_dtype),
        draft_pool=type(dpool).__name__,
        draft_kv_dtype=str(dk.kv_cache_dtype),
        draft_ratios=list(dpool.compression_ratios),
        draft_layers=dpool.layer_num,
        draft_swa_size=dpool.swa_size,
        swa_slots=swa,
        draft_shares_allocator=dalloc is talloc,
        draft_shares_mapping=dpool.full_to_swa_index_mapping is talloc.full_to_swa_index_mapping,
    )

if "build" in steps:
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import _get_quantization_config
    from sglang.srt.models.registry import ModelRegistry

    cls, _ = ModelRegistry.resolve_model_cls(draft.hf_config.architectures)
    quant = _get_quantization_config(draft, LoadConfig())
    from intree_cpu import init_sglang_cpu
    from test_dspark_manifest import build_draft, load_head

    init_sglang_cpu(path)  # the parallel groups the layers read (gloo, one rank)
    dtype = torch.bfloat16 if quant is not None else torch.float32
    model = build_draft(cls, draft.hf_config, quant, dtype)
    unwritten, warnings = load_head(model, path)
    out.update(
        model_class=cls.__name__,
        quant_class=type(quant).__name__ if quant is not None else None,
        fp4_experts=getattr(quant, "is_dsv4_fp4_experts", None),
        stages=len(model.stages), gamma=model.gamma, unwritten=unwritten, warnings=warnings,
    )

print("PROBE " + json.dumps(out))
"""


def probe(path: Path, *steps: str) -> dict:
    env = {
        k: v for k, v in os.environ.items() if k not in ("SGLANG_DSV41_PLUGIN", "SGLANG_PLUGINS")
    }
    res = subprocess.run(
        [sys.executable, "-c", PROBE, str(path), ",".join(steps), str(HERE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [x for x in res.stdout.splitlines() if x.startswith("PROBE ")]
    assert res.returncode == 0 and lines, (res.stdout + res.stderr)[-4000:]
    return json.loads(lines[-1][len("PROBE ") :])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from sglang_dsv41.tools.make_checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("draft") / "tiny", "tiny")


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    from sglang_dsv41.tools.release_checkpoint import write_flash_mini

    return write_flash_mini(tmp_path_factory.mktemp("draft") / "mini")


V4_ATTENTION = {"head_dim": 512, "qk_rope_head_dim": 64, "index_head_dim": 128}
"""V4's attention geometry, which SGLang's DeepSeekV4TokenToKVPool asserts (584 B records)."""


@pytest.fixture(scope="module")
def mini_v4_heads(mini, tmp_path_factory):
    """flash-mini's config at V4's attention geometry (no weights: the pools read the config)."""
    out = tmp_path_factory.mktemp("draft") / "mini_v4_heads"
    out.mkdir(exist_ok=True)
    raw = json.loads((mini / "config.json").read_text())
    raw["text_config"].update(V4_ATTENTION)
    (out / "config.json").write_text(json.dumps(raw))
    for f in mini.iterdir():
        if f.name != "config.json" and not f.name.endswith(".safetensors"):
            (out / f.name).write_bytes(f.read_bytes())
    return out


def _head_of(path: Path):
    from sglang_dsv41.config import DeepseekV41Config
    from sglang_dsv41.weights.dspark_manifest import DSparkHead

    return DSparkHead.of(DeepseekV41Config.from_hf(str(path)))


@pytest.mark.parametrize("which", ["tiny", "mini"])
def test_draft_config_resolves_to_sglangs_dspark(which, tiny, mini):
    path = tiny if which == "tiny" else mini
    got = probe(path, "config", "backends")
    assert got["target_arch"] == "DeepseekV41ForCausalLM"
    assert got["draft_arch"] == "DeepseekV4ForCausalLMDSpark"
    assert got["stock_draft_arch"] == "DeepseekV41ForCausalLM"  # SGLang alone: our class
    assert got["draft_config_class"] == "sglang.srt.configs.deepseek_v41.DeepseekV41Config"
    assert got["draft_is_v4"] and not got["stock_draft_is_v4"]
    assert got["draft_v4_arch"] and got["draft_hybrid_swa"]
    head = _head_of(path)
    assert got["aux_stages"] == head.stages == 3
    assert got["aux_target_layers"] == list(head.target_layer_ids)
    assert got["aux_draft_arch"] == "DeepseekV4ForCausalLMDSpark"
    if which == "mini":  # released format: SGLang's FP8 linears with FP4 routed experts
        assert got["draft_quantization"] == "fp8" and got["draft_fp4_experts"]
    else:
        assert got["draft_quantization"] is None
    assert got["target_backend"] == ["dsv41", "dsv41"]
    assert got["draft_backend"] == ["dsv4", "dsv4"]
    assert got["stock_draft_backend"] == "flashinfer"  # SGLang alone: the generic fallback


def test_target_keeps_our_pool_draft_gets_sglangs(mini_v4_heads):
    got = probe(mini_v4_heads, "pools")
    assert got["target_configurator"] == "DSV41PoolConfigurator"
    assert got["draft_configurator"] == "Chosen"  # SGLang's DSV4PoolConfigurator, recorded
    assert (got["target_pool"], got["target_allocator"]) == (
        "DSV41KVPool",
        "SWATokenToKVPoolAllocator",
    )
    assert got["draft_pool"] == "DeepSeekV4TokenToKVPool"
    assert got["draft_kv_dtype"] == "torch.float8_e4m3fn"
    assert got["draft_ratios"] == [0, 0, 0] and got["draft_layers"] == 3
    assert got["draft_swa_size"] == got["swa_slots"] > 0
    assert got["draft_shares_allocator"] and got["draft_shares_mapping"]


def test_sglang_builds_and_loads_the_resolved_draft(mini):
    got = probe(mini, "build")
    assert got["model_class"] == "DeepseekV4ForCausalLMDSpark"
    assert got["quant_class"] == "Fp8Config" and got["fp4_experts"]
    assert (got["stages"], got["gamma"]) == (3, 5)
    assert got["unwritten"] == [] and got["warnings"] == []


def test_a_draft_of_our_architecture_is_refused_naming_the_flag():
    from types import SimpleNamespace as NS

    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_dsv41.sglang.hooks import serves_ours

    ours = NS(hf_config=NS(architectures=["DeepseekV41ForCausalLM"]))
    sglangs = NS(hf_config=NS(architectures=["DeepseekV4ForCausalLMDSpark"]))
    dspark = SpeculativeAlgorithm.from_string("DSPARK")
    assert serves_ours(NS(model_config=ours, is_draft_worker=False, spec_algorithm=dspark))
    assert not serves_ours(NS(model_config=sglangs, is_draft_worker=True, spec_algorithm=dspark))
    with pytest.raises(ValueError, match="--speculative-draft-model-path"):
        serves_ours(NS(model_config=ours, is_draft_worker=True, spec_algorithm=dspark))


def test_dspark_server_defaults(monkeypatch):
    from types import SimpleNamespace as NS

    import sglang.srt.arg_groups.model_override_base as mob
    from sglang.srt.arg_groups.arg_utils import resolvable_fields
    from sglang.srt.server_args import ServerArgs

    from sglang_dsv41.dspark_defaults import dspark_server_defaults
    from sglang_dsv41.sglang import server_defaults as sd

    def view(**kw):
        base = dict(device="cuda", page_size=1, speculative_algorithm="DSPARK")
        return NS(**{**base, **kw})

    want = {"page_size": 256, "speculative_draft_kv_cache_dtype": "fp8_e4m3"}
    assert dspark_server_defaults(view()) == want
    assert dspark_server_defaults(view(page_size=256, speculative_draft_kv_cache_dtype="bf16")) == {
        "page_size": 256
    }
    assert dspark_server_defaults(view(device="cpu")) == {}
    assert dspark_server_defaults(view(speculative_algorithm=None)) == {}
    with pytest.raises(ValueError, match="--page-size 2: .*--page-size 256"):
        dspark_server_defaults(view(page_size=2))
    monkeypatch.setattr(mob, "resolving_view", lambda s: view())
    monkeypatch.setattr(sd, "cuda_server_defaults", lambda s, h: {})
    args = NS(attention_backend=None, prefill_attention_backend=None)
    args.decode_attention_backend, args.dtype = None, "bfloat16"
    out = sd.server_defaults(args, None)
    assert out["page_size"] == 256 and out["speculative_draft_kv_cache_dtype"] == "fp8_e4m3"
    assert set(out) <= resolvable_fields(ServerArgs)
