"""Attention backend `dsv41`: the per-forward batch metadata of the cached path.

SGLang calls `init_forward_metadata(forward_batch)` before every model forward (extend, decode,
mixed, idle; under speculative decoding, target verify: `width` rows per request after its
committed length, `speculative.py`). The backend turns SGLang's batch description (request
slots, prefix and extend lengths, output slots, slot table) into a `serving.context.BatchContext`
built with tensor ops on the pool's device; the model's layers then read and write the
`DSV41KVPool` through it (`serving.layer_loop`). Decode and verify metadata need no host sync;
extend checks SGLang's positions and whether any row lies below its request's replay floor (one
sync each, as SGLang's extend does), and puts the replay segment of a request that resumes a
prefix hit whose SWA is gone in front of its rows (serving.prefix_replay, docs/design.md 2.8).

CUDA graphs (decode, or target verify under speculative decoding): SGLang captures one graph
per padded batch size; the metadata is built inside the capture from the batch's static input
tensors (request slots, sequence lengths, output slots), so a replay rebuilds it on the device.
Padded rows point at request slot 0 and slot 0, the padding rows of every table and buffer. On
CUDA, decode and verify page tables span the slot table's whole width, in eager forwards too,
so a replay computes exactly what the eager forward does. Prefill runs eager.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from sglang_dsv41.serving.context import (
    BatchContext,
    decode_context,
    rows_from_lens,
    slots_bound,
    verify_context,
)
from sglang_dsv41.serving.prefix_replay import fold_batch
from sglang_dsv41.sglang.speculative import check_verify_width, verify_width_of

BACKEND_NAME = "dsv41"


def _host_list(cpu, tensor) -> list:
    """SGLang's host mirror of a per-request length, or the device tensor's values."""
    return [int(n) for n in (cpu if cpu is not None else tensor.tolist())]


class DSV41AttnBackend(AttentionBackend):
    served_by = "sglang_dsv41"

    def __init__(self, model_runner):
        super().__init__()
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.token_to_kv_pool = model_runner.token_to_kv_pool

    def init_forward_metadata(self, forward_batch):
        fb = forward_batch
        if fb.forward_mode.is_idle():
            fb.dsv41_context = None
            return
        folds = self.token_to_kv_pool.apply_starts()
        fb.dsv41_context = self._context(fb, folds)

    def _context(self, fb, folds=None) -> BatchContext:
        """folds: request slot -> the replay segment ids this forward runs in front of the
        request's rows (RecordBuffers.apply_starts; extend batches)."""
        pool = self.token_to_kv_pool
        dev = self.req_to_token.device
        decode = fb.forward_mode.is_decode()
        req_pool = fb.req_pool_indices.to(dev, torch.int64)
        seq_lens = fb.seq_lens.to(dev, torch.int64)
        out_loc = fb.out_cache_loc.to(dev, torch.int64)
        floors = pool.floor[req_pool]
        resume = pool.resume[req_pool] if pool.prefix_replay else None
        if fb.forward_mode.is_target_verify():
            return self._verify_context(fb, req_pool, seq_lens, out_loc, floors, resume)
        r2t = self.req_to_token
        if decode and dev.type == "cuda":
            return decode_context(req_pool, seq_lens, out_loc, r2t, floors, r2t.shape[1], resume)
        seq_cpu = fb.seq_lens_cpu if fb.seq_lens_cpu is not None else fb.seq_lens.cpu()
        table_len = int(seq_cpu.max())
        if decode:
            return decode_context(req_pool, seq_lens, out_loc, r2t, floors, table_len, resume)
        prefix, extend, out_loc, fold = fold_batch(
            _host_list(fb.extend_prefix_lens_cpu, fb.extend_prefix_lens),
            _host_list(fb.extend_seq_lens_cpu, fb.extend_seq_lens),
            fb.req_pool_indices.tolist(),
            fb.input_ids,
            out_loc,
            folds or {},
            r2t,
        )
        prefix_t = torch.tensor(prefix, dtype=torch.int64, device=dev)
        extend_t = torch.tensor(extend, dtype=torch.int64, device=dev)
        rows = rows_from_lens(prefix_t, extend_t, sum(extend))
        kept = rows.pos if fold is None else rows.pos[fold.keep]
        if fb.positions is not None and not torch.equal(fb.positions.to(dev).long(), kept):
            raise RuntimeError("dsv41 backend: batch positions are not [prefix, seq) per request")
        replaying = pool.replay and bool((rows.pos < floors[rows.req]).any())
        # Kept on the batch, not the backend: SGLang may prepare the next batch's metadata while
        # this one is still running (overlap scheduling).
        return BatchContext(
            rows=rows,
            req_pool=req_pool,
            req_to_token=self.req_to_token,
            seq_lens=seq_lens,
            table_len=table_len,
            floors=floors,
            out_loc=out_loc,
            replaying=replaying,
            max_slots=slots_bound(seq_cpu),
            resume=resume,
            swa_floors=pool.swa_floor[req_pool] if resume is not None else None,
            fold=fold,
        )

    def _verify_context(self, fb, req_pool, prefix_lens, out_loc, floors, resume):
        """TARGET_VERIFY: `width` rows per request after its committed length (SGLang's
        seq_lens in a verify batch exclude the block). No host sync on CUDA (page tables span
        the slot table, as in decode), so SGLang's graph runner can capture it."""
        width = verify_width_of(fb)
        check_verify_width(width, getattr(self.token_to_kv_pool, "verify_width", 1))
        if self.req_to_token.device.type == "cuda":
            table_len = self.req_to_token.shape[1]
        else:
            table_len = int(prefix_lens.max()) + width
        return verify_context(
            req_pool, prefix_lens, width, out_loc, self.req_to_token, floors, table_len, resume
        )

    # ------------------------------------------------------------------ CUDA graphs (decode)
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        """Nothing to preallocate: the metadata is built inside each captured graph. The record
        codecs' decode tables go to the device now (no host copy may happen in a capture)."""
        from sglang_dsv41.kv.fp import warm_tables

        self.cuda_graph_max_bs = max_bs
        warm_tables(self.req_to_token.device)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        mode = forward_batch.forward_mode
        if not (mode.is_decode() or mode.is_target_verify()):
            raise NotImplementedError(
                "dsv41 backend: CUDA graphs capture decode and target verify only (prefill "
                "runs eager)"
            )

    def init_forward_metadata_in_graph(self, forward_batch):
        forward_batch.dsv41_context = self._context(forward_batch)

    def get_cuda_graph_seq_len_fill_value(self):
        return 1
