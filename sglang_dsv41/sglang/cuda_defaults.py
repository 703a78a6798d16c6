"""Server defaults for the in-tree CUDA model (a released-format checkpoint on a CUDA device).

    moe_runner_backend       flashinfer_mxfp4 on SM90 / SM100 / SM120 without an all-to-all
                             MoE backend: the packed-FP4 routed experts' runner (SGLang's
                             default Triton runner reads the packed FP4 bytes as FP8)
    fp8_gemm_runner_backend  flashinfer_cutedsl on SM100 (the 32x32 UE8M0 blocks served as
                             MXFP8, as SGLang does for its own V4.1); SGLang's default (DeepGEMM
                             block-32, its Triton fallback) elsewhere
    CUDA graphs              checked, not set (SGLang 0.5.23 lets no model declaration turn
                             graphs off: `disable_*cuda_graph` are not model-overridable fields),
                             so a launch without the flag below fails at argument resolution
                             naming it. While INTREE_DECODE_GRAPHS_VERIFIED is False:
                             --disable-cuda-graph (the in-tree layer loop with the dsv41 backend
                             has not run under capture; docs/speculative.md 5). Once True:
                             decode graphs on, prefill graphs off (--disable-prefill-cuda-graph,
                             PREFILL_EAGER_REASON, logged at startup)
On SM90 the FP4 runner (flashinfer CUTLASS, W4A16) needs the hidden size and the per-rank expert
width (moe_intermediate_size * ep_size / tp_size) to be multiples of 128; V4.1-Flash's 2304 at
--tp 8 gives 288, so the error says to shard the experts by expert parallelism (--ep-size 8).
A value the user set explicitly (anything but "auto") is kept. The attention backend and the
page size come from `server_defaults`.
"""

from __future__ import annotations

import logging

from sglang_dsv41.config import DeepseekV41Config

logger = logging.getLogger(__name__)

INTREE_DECODE_GRAPHS_VERIFIED = False
"""The one switch for decode CUDA graphs of the in-tree CUDA model. Set it True once
tests/gpu/test_intree_graphs.py passes on a GPU (graph replay equals eager decode bit for bit on
the flash-slice; docs/speculative.md 5): the server then captures decode graphs and asks only
for prefill graphs off."""

PREFILL_EAGER_REASON = (
    "the dsv41 backend's extend metadata reads positions, replay floors and the attention "
    "workspace's slot bound on the host, and the replay tail has no prefill-graph members"
)


def check_graph_flags(cfg) -> None:
    """Raise naming the flag the in-tree model needs (module docstring); log why prefill runs
    eager when decode graphs are allowed."""
    if not INTREE_DECODE_GRAPHS_VERIFIED:
        if not cfg.disable_cuda_graph:
            raise ValueError(
                "--disable-cuda-graph: the released V4.1 format on CUDA runs SGLang's in-tree "
                "model with the dsv41 attention backend, which is not verified under CUDA-graph "
                "capture in this version; start the server with --disable-cuda-graph"
            )
        return
    prefill_off = (
        cfg.disable_cuda_graph
        or getattr(cfg, "disable_prefill_cuda_graph", False)
        or str(getattr(cfg, "cuda_graph_backend_prefill", None)) == "disabled"
    )
    if not prefill_off:
        raise ValueError(
            "--disable-prefill-cuda-graph: the released V4.1 format on CUDA decodes in CUDA "
            f"graphs but prefills eagerly ({PREFILL_EAGER_REASON}); start the server with "
            "--disable-prefill-cuda-graph"
        )
    logger.info(
        "sglang_dsv41: the in-tree CUDA model decodes in CUDA graphs%s; prefill runs eager: %s",
        " (off: --disable-cuda-graph)" if cfg.disable_cuda_graph else "",
        PREFILL_EAGER_REASON,
    )


def check_sm90_expert_width(cfg: DeepseekV41Config, tp: int, ep: int) -> None:
    """Raise naming the flag when SGLang's SM90 FP4 MoE runner cannot take the shapes."""
    width = cfg.moe_intermediate_size * ep // tp
    if cfg.hidden_size % 128 or width % 128:
        raise ValueError(
            f"--ep-size: on SM90 the FP4 routed experts need hidden_size ({cfg.hidden_size}) and "
            f"the per-rank expert width (moe_intermediate_size {cfg.moe_intermediate_size} x "
            f"ep {ep} / tp {tp} = {width}) to be multiples of 128; serve the experts expert-"
            f"parallel (--ep-size {tp})"
        )


def cuda_server_defaults(server_args, hf_config) -> dict:
    from sglang.srt.arg_groups.model_override_base import resolving_view
    from sglang.srt.runtime_context import get_platform
    from sglang.srt.utils import is_flashinfer_available

    from sglang_dsv41.weights.checkpoint import is_release_format

    cfg = resolving_view(server_args)
    if cfg.device != "cuda" or not is_release_format(hf_config.dsv41()):
        return {}
    check_graph_flags(cfg)
    platform = get_platform()
    out = {}
    hopper_or_blackwell = platform.is_sm90 or platform.is_sm100 or platform.is_sm120
    if (
        cfg.moe_runner_backend == "auto"
        and cfg.moe_a2a_backend == "none"
        and hopper_or_blackwell
        and not platform.is_hip
    ):
        if not is_flashinfer_available():
            raise ValueError(
                "--moe-runner-backend: the released FP4 routed experts need flashinfer_mxfp4 "
                "(install flashinfer); SGLang's default runner reads packed FP4 as FP8"
            )
        out["moe_runner_backend"] = "flashinfer_mxfp4"
        if platform.is_sm90:
            check_sm90_expert_width(hf_config.dsv41(), int(cfg.tp_size), int(cfg.ep_size or 1))
    if (
        platform.is_sm100
        and not platform.is_hip
        and cfg.fp8_gemm_runner_backend == "auto"
        and is_flashinfer_available()
    ):
        out["fp8_gemm_runner_backend"] = "flashinfer_cutedsl"
    logger.info("sglang_dsv41: in-tree CUDA model defaults %s", out)
    return out
