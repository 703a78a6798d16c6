"""Per-architecture server defaults for DeepseekV41ForCausalLM (a `register_model_override`
provider), so that `--model-path DIR --device cpu` needs no other flag.

    attention backend   dsv41 (prefill and decode)
    dtype               the checkpoint's torch_dtype when --dtype is auto (SGLang would turn an
                        fp32 checkpoint into fp16; the tiny model is fp32 and must stay so to
                        match the reference)
    page size           2 when odd: a ratio-2 entry's two tokens share a page, so radix hits
                        end on entry boundaries and the entry's row is slot // 2
    DSPARK on CUDA      page size 256 and the draft's FP8 records (sglang_dsv41/dspark_defaults.py)
    CUDA + released format   cuda_defaults.py (MoE runner, FP8 GEMM backend; requires
                        --disable-cuda-graph)
    CUDA, this package's torch model
                        overlap scheduling off: with it on, two identical greedy requests gave
                        different tokens on the H200, with it off they did not (cause not
                        found). Decode CUDA graphs stay on (the backend captures them); SGLang
                        itself runs prefill eager for this model class (it has no `.model`), as
                        the startup log says.
Only fields SGLang lets a model declare are set (`resolvable_fields(ServerArgs)`; checked in
tests/cpu/test_intree_api.py): graph switches are not among them.
"""

from __future__ import annotations

import logging

from sglang_dsv41.dspark_defaults import dspark_server_defaults
from sglang_dsv41.sglang.backend import BACKEND_NAME
from sglang_dsv41.sglang.cuda_defaults import cuda_server_defaults

logger = logging.getLogger(__name__)


def server_defaults(server_args, hf_config) -> dict:
    from sglang.srt.arg_groups.model_override_base import resolving_view

    cfg = resolving_view(server_args)
    out = {}
    for name in ("attention_backend", "prefill_attention_backend", "decode_attention_backend"):
        value = getattr(server_args, name, None)  # the user's own flag, not a platform default
        if value is not None and value != BACKEND_NAME:
            raise ValueError(
                f"--{name.replace('_', '-')} {value}: DeepseekV41ForCausalLM is "
                f"served by the '{BACKEND_NAME}' backend of sglang_dsv41"
            )
        out[name] = BACKEND_NAME
    if getattr(server_args, "dtype", "auto") == "auto":
        out["dtype"] = str(hf_config.dsv41().torch_dtype).replace("torch.", "")
    if int(cfg.page_size or 1) % 2:
        out["page_size"] = 2
    cuda = cuda_server_defaults(server_args, hf_config)
    if cfg.device == "cuda" and not cuda:
        out["disable_overlap_schedule"] = True
        logger.info(
            "sglang_dsv41: on CUDA decode runs in CUDA graphs, prefill eager (its metadata reads "
            "positions and replay floors on the host); overlap scheduling is off"
        )
    out.update(cuda)
    out.update(dspark_server_defaults(cfg))
    return out
