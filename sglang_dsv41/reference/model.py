"""ReferenceModel: the whole V4.1 text model over a full token sequence, no cache (the oracle).

forward(input_ids, replay_floor=F) computes logits exactly as docs/design.md 2.2 and 2.5 say.
F = 0 is the full forward. F > 0 is decoder SWA bounded replay: encoder layers run on all L
tokens, the decoder's Full layer compresses (and projects index K from) its attention input over
all L tokens, and the decoder's attention and FFN run only on positions >= F, with SWA spans
floored at F. Logits exist for rows >= F (earlier rows are NaN). forward(..., resumes=(M,))
states a prompt served from a prefix cache hit of M tokens whose SWA had been evicted
(docs/design.md 2.8): a second pass from replay_floor(M) with every layer's SWA floored there,
over the global KV the first pass left below M.

The residual is `layers.residual.build_residual(cfg)`: plain pre-norm (hc_mult = 1) or the mHC
streams (hc_mult > 1). Engram layers rewrite the residual before their attention mixing, with
hash rows from `engram_hasher` (built from the checkpoint's tokenizer.json by from_pretrained;
the identity token map otherwise). from_pretrained reads the dense format or, when config.json
declares the released quantization, the released FP8/FP4 format (dequantized on CPU).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.layers.block import Block
from sglang_dsv41.layers.dtypes import upcast
from sglang_dsv41.layers.linear import Linear
from sglang_dsv41.layers.norm import RMSNorm
from sglang_dsv41.layers.residual import build_residual
from sglang_dsv41.reference.attention import SharedState, attention_layer


class ReferenceModel(nn.Module):
    def __init__(self, cfg: DeepseekV41Config):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.head = Linear(cfg.hidden_size, cfg.vocab_size)
        self.residual = build_residual(cfg)
        self.engram_hasher = None  # built on first use (identity map) or by from_pretrained

    @classmethod
    def from_pretrained(cls, path: str, dtype=torch.float32) -> ReferenceModel:
        """Load `config.json` + `*.safetensors` from a checkpoint directory, strictly."""
        from sglang_dsv41.layers.engram import build_engram_hasher
        from sglang_dsv41.reference.loading import load_state
        from sglang_dsv41.weights.checkpoint import is_release_format, load_release_state

        cfg = DeepseekV41Config.from_hf(path)
        with torch.device("meta"):
            model = cls(cfg)
        if is_release_format(cfg):
            model.load_state_dict(load_release_state(path, cfg, dtype), assign=True)
        else:
            model.load_state_dict(load_state(path, model.state_dict(), dtype), assign=True)
        model.residual = build_residual(cfg)
        model.engram_hasher = build_engram_hasher(cfg, path)
        for block in model.layers:  # non-persistent rope tables are rebuilt off the meta device
            from sglang_dsv41.layers.rope import rope_inv_freq

            block.attn.inv_freq = rope_inv_freq(cfg, block.attn.ratio)
        return model.eval()

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        replay_floor: int = 0,
        capture: dict | None = None,
        shared: SharedState | None = None,
        resumes: tuple = (),
    ) -> torch.Tensor:
        """input_ids int64 [L] -> logits fp32 [L, vocab] (rows below the last pass's decoder
        floor are NaN; fp64 for a float64 model).

        resumes: increasing positions M (multiples of every compress ratio, 0 < M < L) where
        the computation resumed from a prefix cache hit whose SWA was gone (docs/design.md 2.8):
        the tokens before M keep the global KV of the earlier passes; tokens from
        replay_floor(M) on are recomputed with every layer's SWA floored there. () is one pass.
        capture: if a dict, receives layer index -> (positions [T], residual state after it).
        shared: if given, the SharedState the last pass fills (main KV, index K, top-k,
        candidate pool), left for the caller to inspect (tools.recall_report).
        """
        cfg, L = self.cfg, input_ids.shape[0]
        F = int(replay_floor)
        if F and (err := cfg.replay_error()):
            raise err
        points = resume_points(cfg, resumes, L)
        prior = None
        for M, end in zip(points, points[1:] + [L], strict=True):
            last = end == L
            E = cfg.replay_floor(M) if M else 0
            state = shared if last and shared is not None else SharedState()
            state.start, state.prior, state.kept_below = E, prior, M
            logits = self._pass(
                input_ids[:end], E, max(F, E) if last else E, state, capture if last else None
            )
            prior = state
        return logits

    def _pass(self, input_ids, start: int, dec_floor: int, shared: SharedState, capture):
        """One pass over the rows at positions [start, L): every layer's SWA floored at start,
        the decoder's rows and SWA at dec_floor (>= start; bounded replay). -> logits [L, V],
        NaN below dec_floor."""
        cfg, L = self.cfg, input_ids.shape[0]
        pos_all = torch.arange(start, L)
        state = self.residual.init(self.embed(input_ids[start:]))
        hash_rows = self._engram_rows(input_ids, torch.arange(L))  # [L, n_layers, cols] | None
        pos, floor = pos_all, start
        for i, block in enumerate(self.layers):
            if block.engram is not None:
                rows = hash_rows[pos, block.engram.hash_index]
                state = self.residual.inject(state, lambda H, e=block.engram, r=rows: e(H, r))
            x_all = None
            if i == cfg.decoder_start and dec_floor > start:
                x_all = self.residual.attn_input(state, block)  # the decoder's Full layer input
                state = self.residual.select(state, torch.arange(dec_floor - start, L - start))
                pos, floor = pos_all[dec_floor - start :], dec_floor
            x = self.residual.attn_input(state, block)
            y = attention_layer(block.attn, x, pos, floor, shared, x_all=x_all)
            state = self.residual.attn_done(state, block, y)
            state = self.residual.ffn_done(
                state, block, block.ffn(self.residual.ffn_input(state, block))
            )
            if capture is not None:
                capture[i] = (pos, state)
        h = self.norm(self.residual.final(state))
        logits = upcast(self.head(h))
        if pos[0] > 0:
            full = torch.full((L, logits.shape[1]), float("nan"), dtype=logits.dtype)
            full[pos] = logits
            logits = full
        return logits

    def _engram_rows(self, input_ids: torch.Tensor, pos: torch.Tensor):
        if not self.cfg.engram_layer_ids:
            return None
        if self.engram_hasher is None:
            from sglang_dsv41.layers.engram import build_engram_hasher

            self.engram_hasher = build_engram_hasher(self.cfg)
        return self.engram_hasher(input_ids, pos)

    def replay_floor_for(self, prompt_len: int, replay: bool) -> int:
        """The replay floor of a prompt (`DeepseekV41Config.replay_floor`), 0 without replay."""
        return self.cfg.replay_floor(prompt_len) if replay else 0

    @torch.no_grad()
    def generate(
        self, prompt_ids, max_new_tokens: int, replay: bool = True, stop_ids=(), resumes=()
    ) -> list:
        """Greedy continuation by full recomputation. The replay floor is fixed at prefill
        (max(0, len(prompt) - window)), as serving replays once and then decodes; resumes as in
        `forward` (a prompt served from prefix cache hits whose SWA was gone)."""
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("prompt_ids is empty")
        F = self.replay_floor_for(len(ids), replay)
        out = []
        for _ in range(max_new_tokens):
            ids_t = torch.tensor(ids, dtype=torch.int64)
            logits = self.forward(ids_t, replay_floor=F, resumes=resumes)
            nxt = int(torch.argmax(logits[-1]))
            out.append(nxt)
            ids.append(nxt)
            if nxt in stop_ids:
                break
        return out


def resume_points(cfg: DeepseekV41Config, resumes, length: int) -> list:
    """[0, M1, M2, ...]: the passes' starting points, checked (increasing, inside the sequence,
    on an entry boundary of every kv source)."""
    points = [0] + [int(m) for m in resumes]
    step = max((cfg.ratio(s) for s in cfg.kv_source_layer_ids), default=1)
    for a, b in zip(points, points[1:], strict=False):
        if not a < b < length or b % step:
            raise ValueError(
                f"resumes {list(resumes)}: increasing positions in (0, {length}), multiples "
                f"of {step}"
            )
    return points


def load_reference(path: str | os.PathLike, dtype=torch.float32) -> ReferenceModel:
    return ReferenceModel.from_pretrained(os.fspath(path), dtype)
