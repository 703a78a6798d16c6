"""Attention backend `dsv41`: the per-forward batch metadata of the cached path.

SGLang calls `init_forward_metadata(forward_batch)` before every model forward (extend, decode,
mixed, idle). The backend turns SGLang's batch description (request slots, prefix and extend
lengths, output slots, slot table) into a `serving.context.BatchContext` built with tensor ops on
the pool's device; the model's layers then read and write the `DSV41KVPool` through it
(`serving.layer_loop`). Decode metadata needs no host sync; extend checks SGLang's positions and
whether any row lies below its request's replay floor (one sync each, as SGLang's extend does).
"""

from __future__ import annotations

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from sglang_dsv41.serving.context import BatchContext, rows_from_lens

BACKEND_NAME = "dsv41"


class DSV41AttnBackend(AttentionBackend):
    served_by = "sglang_dsv41"

    def __init__(self, model_runner):
        super().__init__()
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.token_to_kv_pool = model_runner.token_to_kv_pool

    def init_forward_metadata(self, forward_batch):
        fb = forward_batch
        mode = fb.forward_mode
        if mode.is_idle():
            fb.dsv41_context = None
            return
        pool = self.token_to_kv_pool
        dev = self.req_to_token.device
        req_pool = fb.req_pool_indices.to(dev, torch.int64)
        seq_lens = fb.seq_lens.to(dev, torch.int64)
        if mode.is_decode():
            B = seq_lens.numel()
            rows = rows_from_lens(seq_lens - 1, torch.ones_like(seq_lens), B)
        else:
            prefix = fb.extend_prefix_lens.to(dev, torch.int64)
            extend = fb.extend_seq_lens.to(dev, torch.int64)
            rows = rows_from_lens(prefix, extend, int(fb.extend_num_tokens))
        seq_cpu = fb.seq_lens_cpu if fb.seq_lens_cpu is not None else fb.seq_lens.cpu()
        floors = pool.floor[req_pool]
        replaying = False
        if not mode.is_decode():
            if fb.positions is not None and not torch.equal(fb.positions.to(dev).long(), rows.pos):
                raise RuntimeError(
                    "dsv41 backend: batch positions are not [prefix, seq) per request"
                )
            replaying = pool.replay and bool((rows.pos < floors[rows.req]).any())
        # Kept on the batch, not the backend: SGLang may prepare the next batch's metadata while
        # this one is still running (overlap scheduling).
        fb.dsv41_context = BatchContext(
            rows=rows,
            req_pool=req_pool,
            req_to_token=self.req_to_token,
            seq_lens=seq_lens,
            max_seq_len=int(seq_cpu.max()),
            floors=floors,
            out_loc=fb.out_cache_loc.to(dev, torch.int64),
            replaying=replaying,
        )

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        raise NotImplementedError("dsv41 backend: no CUDA graphs")


def create_backend(model_runner):
    return DSV41AttnBackend(model_runner)
