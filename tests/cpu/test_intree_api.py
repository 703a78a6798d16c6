"""The SGLang in-tree members and signatures the CUDA model relies on (fails loudly on an
SGLang upgrade that moves them), the replay-tail backend members, the model choice and the CUDA
server defaults."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

intree = pytest.importorskip("sglang.srt.models.deepseek_v4")

from sglang_dsv41.serving.context import BatchContext, build_rows  # noqa: E402
from sglang_dsv41.sglang.replay_tail import LateLayerTailMixin  # noqa: E402


def _params(fn) -> str:
    """The parameter names of `fn`, in order, joined by spaces."""
    return " ".join(inspect.signature(fn).parameters)


def _source_with(fn, *parts) -> str:
    """The source of `fn`, asserted to contain each of `parts`."""
    src = inspect.getsource(fn)
    for part in parts:
        assert part in src, part
    return src


def test_in_tree_classes_and_factories():
    assert issubclass(intree.MQALayer, intree.MqaAttentionBase)
    assert issubclass(intree.DeepseekV4DecoderLayer, intree.DeepseekV4DecoderLayerBase)
    assert _params(intree.DeepseekV4ForCausalLM.__init__) == "self config quant_config prefix"
    assert (
        _params(intree.DeepseekV4DecoderLayerBase._build_self_attn)
        == "self config layer_id quant_config prefix alt_streams compress_ratio_override"
    )
    # the model reads its layer class through this module global while it builds
    src = inspect.getsource(intree.DeepseekV4Model.__init__)
    assert "DeepseekV4DecoderLayer(" in src and "enable_decoder_swa_bounded_replay" in src
    assert "DecoderReplayTail.maybe_create" in src
    for name in ("_project_wo_b", "accepts_mxfp8_swizzled_input", "accepts_deepgemm_mxfp8_input"):
        assert callable(getattr(intree.MQALayer, name)), name
    assert _params(intree.MQALayer._project_wo_b) == "self o defer_all_reduce"


def test_attention_forward_signature_is_the_in_tree_one():
    from sglang_dsv41.sglang.cuda_attention import DSV41CudaAttention

    assert _params(DSV41CudaAttention.forward) == _params(intree.MQALayer.forward)
    assert (
        _params(intree.MQALayer.forward)
        == "self x positions forward_batch x_quant defer_all_reduce"
    )
    src = inspect.getsource(intree.DeepseekV4CudaDecoderLayer._run_boundary_attention)
    assert "self.self_attn(" in src and "defer_all_reduce=True" in src


def test_layer_members_the_adapter_reads():
    _source_with(
        intree.MqaAttentionBase.__init__,
        "self.attn_tp_rank",
        "self.attn_tp_size",
        "self.n_local_groups",
        "self.attn_sink",
        "self.wqkv_a",
        "self.wq_a",
        "self.wkv",
        "self.q_norm",
        "self.wq_b",
        "self.kv_norm",
        "self.wo_a",
        "self.wo_b",
    )
    src = inspect.getsource(intree.MQALayer.__init__)
    assert "DeepseekV41Compressor(" in src and "DeepseekV41Indexer(" in src
    from sglang.srt.layers.attention.dsv4 import dsv41_sparse

    compressor = dsv41_sparse.DeepseekV41Compressor.__init__
    _source_with(compressor, "self.wkv_gate", "self.wkv", "self.wgate", "self.norm")
    indexer = dsv41_sparse.DeepseekV41Indexer.__init__
    _source_with(indexer, "self.wq_b", "self.weights_proj", "self.wk", "self.k_norm")


def test_replay_tail_protocol_calls():
    """The in-tree layer loop's calls into the backend, as the mixin implements them."""
    src = _source_with(
        intree.DeepseekV4Model._forward_layers_hc_pre_from_prev,
        "attn_backend.tail_forward_metadata.late_layer_tail",
        "attn_backend.write_tail_source_kv(",
        "attn_backend.enter_late_layer_tail(forward_batch)",
        "attn_backend.exit_late_layer_tail(saved_full, forward_batch)",
        "attn_backend.prefill_graph_late_layer_saved",
    )
    for kw in ("layer=", "x=", "positions=", "forward_batch="):
        assert kw in src.split("attn_backend.write_tail_source_kv(")[1].split(")")[0], kw
    from sglang.srt.layers.attention.deepseek_v4_backend import LateLayerTail

    fields = set(LateLayerTail.__struct_fields__)
    assert {
        "token_indices",
        "positions",
        "extend_seq_lens",
        "extend_seq_lens_cpu",
        "swa_out_cache_loc",
        "contiguous_start",
        "scatter_indices",
        "real_rows_count",
    } <= fields


def test_config_and_server_fields():
    from sglang.srt.arg_groups.choices import FP8_GEMM_RUNNER_BACKEND_CHOICES
    from sglang.srt.configs.deepseek_v41 import DeepseekV41Config
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from sglang.srt.server_args import ServerArgs

    assert DeepseekV41Config.model_type == "deepseek_v41"
    q = Fp8Config.from_config(
        {
            "quant_method": "fp8",
            "weight_block_size": [32, 32],
            "scale_fmt": "ue8m0",
            "activation_scheme": "dynamic",
        }
    )
    for attr in ("is_fp4_experts", "is_dsv4_fp4_experts", "dequant_fp4_to_fp8"):
        assert hasattr(q, attr), attr
    fields = {f for f in inspect.signature(ServerArgs).parameters}
    for f in (
        "moe_runner_backend",
        "moe_a2a_backend",
        "fp8_gemm_runner_backend",
        "disable_prefill_cuda_graph",
        "disable_decode_cuda_graph",
        "enable_decoder_swa_bounded_replay",
    ):
        assert f in fields, f
    assert "flashinfer_cutedsl" in FP8_GEMM_RUNNER_BACKEND_CHOICES


class _Base:
    def init_forward_metadata(self, forward_batch):
        forward_batch.built = True


class _Backend(LateLayerTailMixin, _Base):
    def __init__(self, replay: bool = True):
        self.token_to_kv_pool = SimpleNamespace(replay=replay)  # the pool's ServingOptions


def _batch(prefix, extend, floors, mode="EXTEND"):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    rows = build_rows(prefix, extend)
    T = rows.n
    seq = [p + n for p, n in zip(prefix, extend, strict=True)]
    floors_t = torch.tensor(floors)
    ctx = BatchContext(
        rows=rows,
        req_pool=torch.arange(len(extend)),
        req_to_token=torch.zeros(4, 64, dtype=torch.int32),
        seq_lens=torch.tensor(seq),
        table_len=max(seq),
        floors=floors_t,
        out_loc=torch.arange(T) + 100,
        replaying=bool((rows.pos < floors_t[rows.req]).any()),
    )
    return SimpleNamespace(
        forward_mode=getattr(ForwardMode, mode),
        dsv41_context=ctx,
        positions=rows.pos.clone(),
        out_cache_loc=ctx.out_loc,
    )


def test_tail_is_the_rows_at_or_above_the_floors():
    be, fb = _Backend(), _batch([0, 10], [40, 5], [24, 0])
    be.init_forward_metadata(fb)
    assert fb.built
    tail = be.tail_forward_metadata.late_layer_tail
    assert tail.token_indices.tolist() == list(range(24, 45))
    assert tail.extend_seq_lens_cpu == [16, 5] and tail.extend_seq_lens.tolist() == [16, 5]
    assert tail.positions.tolist() == list(range(24, 40)) + list(range(10, 15))
    assert tail.swa_out_cache_loc.tolist() == list(range(124, 145))
    assert tail.contiguous_start is None and tail.scatter_indices is None
    assert torch.equal(tail.rows(torch.arange(45)), torch.arange(24, 45))
    x = torch.randn(45, 8)
    be.write_tail_source_kv(
        layer=SimpleNamespace(layer_id=20), x=x, positions=fb.positions, forward_batch=fb
    )
    saved = be.enter_late_layer_tail(fb)
    t = be.late_tail
    assert t.rows.ids.tolist() == list(range(24, 45)) and t.source_layer == 20
    x_all, rows_all = t.take_source()
    assert x_all is x and rows_all.n == 45 and t.source is None
    be.exit_late_layer_tail(saved, fb)
    assert be.late_tail is None and be.prefill_graph_late_layer_saved is None


def test_tail_keeps_a_request_whose_rows_all_lie_below_its_floor():
    """A prefill chunk wholly below its floor: its request is in the tail with 0 rows (SGLang
    zips the tail lengths with the batch's requests)."""
    be, fb = _Backend(), _batch([0, 0, 0], [10, 40, 10], [20, 24, 20])
    be.init_forward_metadata(fb)
    tail = be.tail_forward_metadata.late_layer_tail
    assert tail.extend_seq_lens_cpu == [0, 16, 0] and tail.extend_seq_lens.tolist() == [0, 16, 0]
    assert tail.token_indices.tolist() == list(range(34, 50))
    assert tail.positions.tolist() == list(range(24, 40)) and tail.contiguous_start is None


def test_tail_single_request_is_a_view():
    be, fb = _Backend(), _batch([0], [40], [24])
    be.init_forward_metadata(fb)
    assert be.tail_forward_metadata.late_layer_tail.contiguous_start == 24


def test_no_tail_for_decode_or_without_replay():
    be = _Backend()
    be.init_forward_metadata(_batch([40, 9], [1, 1], [24, 0], mode="DECODE"))
    assert be.tail_forward_metadata is None
    with pytest.raises(RuntimeError, match="no tail metadata"):
        be.enter_late_layer_tail(None)
    be.token_to_kv_pool.replay = False
    be.init_forward_metadata(_batch([0], [40], [24]))
    assert be.tail_forward_metadata is None


def _hf(device_release: bool, widths=None):
    from sglang_dsv41.sglang.hf_config import DeepseekV41HFConfig
    from sglang_dsv41.weights.release_config import (
        flash_mini_text_config,
        flash_mini_vision_config,
        release_config,
    )

    text = {**flash_mini_text_config(), **(widths or {})}
    raw = release_config(text, flash_mini_vision_config())
    if not device_release:
        raw.pop("quantization_config")
    return DeepseekV41HFConfig(**raw)


def test_model_choice_by_device_and_format(monkeypatch):
    from sglang_dsv41.sglang import model_choice

    for device, release, want in (
        ("cuda", True, True),
        ("cuda", False, False),
        ("cpu", True, False),
        (None, True, False),
    ):
        monkeypatch.setattr(model_choice, "served_device", lambda d=device: d)
        hf = _hf(release)
        assert model_choice.uses_intree_model(hf) is want, (device, release)
        loc = model_choice.DeepseekV41ForCausalLM.get_model_config_for_expert_location(hf)
        assert (loc is not None) is want
        if want:
            assert (loc.num_layers, loc.num_logical_experts) == (40, 8)


def _defaults(monkeypatch, sm: int, flashinfer: bool, **args):
    import sglang.srt.arg_groups.model_override_base as mob
    import sglang.srt.runtime_context as rc
    import sglang.srt.utils as su

    from sglang_dsv41.sglang.cuda_defaults import cuda_server_defaults

    widths = args.pop("widths", None)
    view = (
        dict(device="cuda", moe_runner_backend="auto", moe_a2a_backend="none")
        | {"fp8_gemm_runner_backend": "auto", "tp_size": 1, "ep_size": 1}
        | {"disable_cuda_graph": True}
        | args
    )
    plat = SimpleNamespace(is_sm90=sm == 90, is_sm100=sm == 100, is_sm120=sm == 120, is_hip=False)
    monkeypatch.setattr(mob, "resolving_view", lambda s: SimpleNamespace(**view))
    monkeypatch.setattr(rc, "get_platform", lambda: plat)
    monkeypatch.setattr(su, "is_flashinfer_available", lambda: flashinfer)
    return cuda_server_defaults(None, _hf(True, widths))


def test_cuda_defaults(monkeypatch):
    from sglang.srt.arg_groups.arg_utils import resolvable_fields
    from sglang.srt.server_args import ServerArgs

    from sglang_dsv41.tools.node_check import NODE_WIDTHS

    off = {}
    h = _defaults(monkeypatch, 90, True, widths=dict(NODE_WIDTHS))
    assert h == off | {"moe_runner_backend": "flashinfer_mxfp4"}
    b = _defaults(monkeypatch, 100, True)
    assert b == off | {
        "moe_runner_backend": "flashinfer_mxfp4",
        "fp8_gemm_runner_backend": "flashinfer_cutedsl",
    }
    assert _defaults(monkeypatch, 100, True, moe_runner_backend="triton") == off | {
        "fp8_gemm_runner_backend": "flashinfer_cutedsl"
    }
    assert _defaults(monkeypatch, 90, True, device="cpu") == {}
    with pytest.raises(ValueError, match="flashinfer_mxfp4"):
        _defaults(monkeypatch, 90, False)
    with pytest.raises(ValueError, match="--disable-cuda-graph"):
        _defaults(monkeypatch, 90, True, disable_cuda_graph=False)
    # SGLang rejects a declaration of any field it does not let a model override (a server on
    # the H200 once failed to start on disable_prefill_cuda_graph)
    assert set(h) | set(b) <= resolvable_fields(ServerArgs)


def test_cuda_graph_switch(monkeypatch):
    """INTREE_DECODE_GRAPHS_VERIFIED lifts the --disable-cuda-graph requirement to prefill only."""
    from sglang_dsv41.sglang import cuda_defaults
    from sglang_dsv41.tools.node_check import NODE_WIDTHS

    monkeypatch.setattr(cuda_defaults, "INTREE_DECODE_GRAPHS_VERIFIED", True)
    want = {"moe_runner_backend": "flashinfer_mxfp4"}
    node = dict(widths=dict(NODE_WIDTHS))
    assert _defaults(monkeypatch, 90, True, **node) == want  # --disable-cuda-graph still ok
    prefill_off = dict(disable_cuda_graph=False, disable_prefill_cuda_graph=True)
    assert _defaults(monkeypatch, 90, True, **node, **prefill_off) == want
    backend_off = dict(disable_cuda_graph=False, cuda_graph_backend_prefill="disabled")
    assert _defaults(monkeypatch, 90, True, **node, **backend_off) == want
    with pytest.raises(ValueError, match="--disable-prefill-cuda-graph.*replay floors"):
        _defaults(monkeypatch, 90, True, **node, disable_cuda_graph=False)


def test_torch_model_defaults_on_cuda_are_model_overridable(monkeypatch):
    import sglang.srt.arg_groups.model_override_base as mob
    from sglang.srt.arg_groups.arg_utils import resolvable_fields
    from sglang.srt.server_args import ServerArgs

    from sglang_dsv41.sglang import server_defaults as sd

    view = SimpleNamespace(device="cuda", page_size=1)
    monkeypatch.setattr(mob, "resolving_view", lambda s: view)
    monkeypatch.setattr(sd, "cuda_server_defaults", lambda s, h: {})
    args = SimpleNamespace(
        attention_backend=None,
        prefill_attention_backend=None,
        decode_attention_backend=None,
        dtype="auto",
    )
    out = sd.server_defaults(args, _hf(False))
    assert out["disable_overlap_schedule"] is True and out["page_size"] == 2
    assert set(out) <= resolvable_fields(ServerArgs)


def test_sm90_expert_width_names_ep_size(monkeypatch):
    from sglang_dsv41.sglang.cuda_defaults import check_sm90_expert_width
    from sglang_dsv41.tools.node_check import NODE_WIDTHS
    from sglang_dsv41.tools.release_checkpoint import flash_config

    flash = flash_config()
    with pytest.raises(ValueError, match=r"--ep-size.* = 288\b.*--ep-size 8"):
        check_sm90_expert_width(flash, 8, 1)
    check_sm90_expert_width(flash, 8, 8)  # 2304 per rank
    with pytest.raises(ValueError, match="hidden_size \\(64\\)"):
        _defaults(monkeypatch, 90, True)  # flash-mini itself: hidden 64
    widths = dict(NODE_WIDTHS)
    assert _defaults(monkeypatch, 90, True, widths=widths, tp_size=2)["moe_runner_backend"]


def test_registered_backend_builds_the_tail_only_for_the_in_tree_model():
    from sglang_dsv41.sglang.replay_tail import DSV41TailBackend, create_backend

    def runner(model):
        pool = SimpleNamespace(req_to_token=torch.zeros(4, 64, dtype=torch.int32))
        kv = SimpleNamespace(replay=True)
        return SimpleNamespace(model=model, req_to_token_pool=pool, token_to_kv_pool=kv)

    torch_model = create_backend(runner(SimpleNamespace()))
    intree_model = create_backend(runner(SimpleNamespace(uses_late_layer_tail=True)))
    assert isinstance(intree_model, DSV41TailBackend)
    assert not torch_model.wants_late_layer_tail and intree_model.wants_late_layer_tail
    fb = _batch([0], [40], [24])
    torch_model.init_late_layer_tail(fb)
    intree_model.init_late_layer_tail(fb)
    assert torch_model.tail_forward_metadata is None
    assert intree_model.tail_forward_metadata.late_layer_tail.contiguous_start == 24


def test_cuda_model_refuses_replay_where_the_in_tree_tail_would_differ(monkeypatch):
    """SGLang's in-tree loop starts the replay tail at the last kv source, ours at the first
    decoder layer: with replay on, a config whose last kv source comes before that layer is
    refused (`DeepseekV41Config.replay_error(tail_at_last_kv_source=True)`) before anything is
    built; the torch model's rule accepts it."""
    from sglang_dsv41.config import ConfigError, DeepseekV41Config
    from sglang_dsv41.presets import tiny
    from sglang_dsv41.sglang import options
    from sglang_dsv41.sglang.cuda_model import DeepseekV41ForCausalLM
    from sglang_dsv41.sglang.hf_config import DeepseekV41HFConfig

    ratios = tiny()["compress_ratios"]
    values = {
        **tiny(),
        "compress_ratios": ratios[:5] + [1] + ratios[6:],
        "kv_source_layer_ids": [1, 3, 5],
        "index_source_layer_ids": [1, 3, 5, 8, 10],
        "candidate_source_layer_id": 5,
    }
    monkeypatch.setattr(options, "replay_flag", lambda: True)
    assert options.ServingOptions.from_server(DeepseekV41Config.from_dict(values)).replay
    with pytest.raises(ConfigError, match="last kv source is layer 5"):
        DeepseekV41ForCausalLM(DeepseekV41HFConfig(**values))
