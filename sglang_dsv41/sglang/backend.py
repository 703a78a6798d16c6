"""Attention backend `dsv41`: builds the per-forward batch metadata the V4.1 layers read.

SGLang calls `init_forward_metadata(forward_batch)` before every model forward (extend, decode,
mixed, idle). The backend turns SGLang's batch description (request slots, prefix and extend
lengths, output slots, slot table) into a `BatchContext`; the model's layers then read and write
the `DSV41KVPool` through it. The attention math lives in `serving_attention` (torch, CPU and
any device); there are no CUDA graphs on this backend.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from sglang_dsv41.sglang import runtime
from sglang_dsv41.sglang.context import BatchContext, build_rows
from sglang_dsv41.sglang.engram_history import EngramHistory

BACKEND_NAME = "dsv41"


class DSV41AttnBackend(AttentionBackend):
    served_by = "sglang_dsv41"

    def __init__(self, model_runner):
        super().__init__()
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        cfg = runtime.STATE.cfg
        self.engram = (
            EngramHistory(cfg.engram_max_ngram_size)
            if cfg is not None and cfg.engram_layer_ids
            else None
        )

    def init_forward_metadata(self, forward_batch):
        fb = forward_batch
        mode = fb.forward_mode
        if mode.is_idle():
            fb.dsv41_context = None
            return
        seq_lens = [
            int(v)
            for v in (fb.seq_lens_cpu if fb.seq_lens_cpu is not None else fb.seq_lens).tolist()
        ]
        if mode.is_decode():
            prefix = [s - 1 for s in seq_lens]
            extend = [1] * len(seq_lens)
        else:
            prefix = [int(v) for v in fb.extend_prefix_lens_cpu]
            extend = [int(v) for v in fb.extend_seq_lens_cpu]
        rows = build_rows(prefix, extend)
        if runtime.STATE.replay and fb.rids is None and not mode.is_decode():
            raise RuntimeError("dsv41 backend: bounded replay needs ForwardBatch.rids")
        floors = runtime.floors_of(fb.rids) if fb.rids is not None else [0] * len(seq_lens)
        if fb.positions is not None and not torch.equal(fb.positions.long().cpu(), rows.pos):
            raise RuntimeError("dsv41 backend: batch positions are not [prefix, seq) per request")
        req_pool = fb.req_pool_indices.long().cpu()
        engram = None
        if self.engram is not None:
            engram = self.engram.windows(
                rows, fb.input_ids.long().cpu(), req_pool.tolist(), fb.rids, runtime.tokens_at
            )
        # Kept on the batch, not the backend: SGLang may prepare the next batch's metadata
        # while this one is still running (overlap scheduling).
        # Batch tensors live where the pool lives: on CUDA the layers take the kernel path
        # (serving.kernel_path), which wants them on the device.
        dev = self.req_to_token.device
        if dev.type != "cpu":
            rows.ids, rows.pos, rows.req = rows.ids.to(dev), rows.pos.to(dev), rows.req.to(dev)
        fb.dsv41_context = BatchContext(
            rows=rows,
            req_pool=req_pool.to(dev),
            req_to_token=self.req_to_token,
            seq_lens=seq_lens,
            floors=list(floors),
            out_loc=fb.out_cache_loc.long().to(dev),
            engram=engram,
        )

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        raise NotImplementedError("dsv41 backend: no CUDA graphs")


def create_backend(model_runner):
    return DSV41AttnBackend(model_runner)
