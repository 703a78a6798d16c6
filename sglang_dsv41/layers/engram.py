"""Engram: hashed n-gram memory added to the mHC streams before a layer's attention mixing.

Facts from public ports of the reference (SGLang's/vLLM's V4.1 engram), re-derived here:

Token compression. Every token id maps to a compressed id: its decoded text is normalized
(NFKC, NFD, strip accents, lowercase, whitespace runs -> " ", then strip, a lone " " kept) and
equal normalized strings share one id, numbered in first-seen order over ids 0..len-1. A token
whose decoding holds U+FFFD (a partial UTF-8 piece) is keyed by its raw vocabulary string. The
number of distinct keys is `engram_compressed_vocab_size` (V_c).

Hashing, per engram layer l (position t, n = engram_max_ngram_size):
    w_s  = compressed id of token t - s, s = 0..n-1; the pad's compressed id where t - s < 0
    mult = 2 * default_rng(10007 * layer_id).integers(0, (INT64_MAX // V_c) // 2, n) + 1
    h_k  = xor_{s < k} (w_s * mult_s)   for k = 2..n   (the k-gram ending at t; no 1-gram)
    row  = h_k % p[l, k, head] + offset[l, k, head]   for each of engram_n_heads heads
Primes: one ascending sequence of distinct primes >= engram_vocab_size, taken in
(layer, k, head) order; offsets are the prefix sums of a layer's primes in that order, so a
layer's table has sum(primes) rows (`engram_num_embeddings[l]` must cover them).
V4.1-Flash: layer 1 primes 16000057..16000463, layer 14 primes 16000477..16000889 (24 each).

Gate (per stream j, fp32): e = dequantized rows [T, (n-1)*heads, head_dim] flattened;
kv = wkv(e) [T, (S+1) d] = S keys then one value; with w = q_weight * k_weight [S, d],
    dot_j = sum(H_j w_j key_j) * rsqrt(mean(H_j^2) + eps) * rsqrt(mean(key_j^2) + eps) / sqrt(d)
    g_j   = sigmoid(sign(dot_j) sqrt(max(|dot_j|, 1e-6)))
    H_j  += g_j value
eps = rms_norm_eps. Image-token masking (vision serving) is out of scope: text only.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.layers.dtypes import upcast
from sglang_dsv41.layers.linear import stable_linear

HASH_SEED = 10007
GATE_CLAMP = 1e-6
_WITNESSES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin (exact far beyond int64 with these witnesses)."""
    if n < 2:
        return False
    for p in _WITNESSES:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in _WITNESSES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def engram_primes(n_layers: int, max_ngram: int, n_heads: int, vocab_size: int) -> list:
    """Moduli: primes[l][k - 2][head] for engram layer index l, n-gram size k = 2..max_ngram.

    One ascending run of primes >= vocab_size, in (layer, k, head) order.
    """
    out, p = [], vocab_size - 1
    for _ in range(n_layers):
        per_k = []
        for _ in range(max_ngram - 1):
            heads = []
            for _ in range(n_heads):
                p += 1
                while not is_prime(p):
                    p += 1
                heads.append(p)
            per_k.append(heads)
        out.append(per_k)
    return out


def engram_multipliers(layer_id: int, max_ngram: int, compressed_vocab: int) -> Tensor:
    """Odd hash multipliers int64 [max_ngram] of one layer (numpy default_rng(10007 * layer)).

    The bound keeps compressed_id * multiplier below 2^63, so products never overflow.
    """
    bound = max(1, (np.iinfo(np.int64).max // compressed_vocab) // 2)
    rng = np.random.default_rng(HASH_SEED * layer_id)
    draws = rng.integers(low=0, high=bound, size=(max_ngram,), dtype=np.int64)
    return torch.from_numpy(draws * 2 + 1)


def compressed_token_map(tokenizer) -> tuple[Tensor, int]:
    """(map int64 [vocab], V_c): token id -> compressed id for a `tokenizers.Tokenizer` or a
    transformers tokenizer (its `backend_tokenizer` is used; ids 0..len(tokenizer)-1)."""
    from tokenizers import Regex, normalizers

    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    n = (
        len(tokenizer)
        if hasattr(tokenizer, "backend_tokenizer")
        else backend.get_vocab_size(with_added_tokens=True)
    )
    keep = "\ue000"  # private-use stand-in so a lone space survives Strip()
    norm = normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), keep),
            normalizers.Strip(),
            normalizers.Replace(keep, " "),
        ]
    )
    ids: dict = {}
    table = []
    for tok in range(n):
        text = backend.decode([tok], skip_special_tokens=False)
        if "\ufffd" in text:
            key = backend.id_to_token(tok)
        else:
            key = norm.normalize_str(text) or text
        table.append(ids.setdefault(key, len(ids)))
    return torch.tensor(table, dtype=torch.int64), len(ids)


def build_engram_hasher(cfg: DeepseekV41Config, checkpoint_dir=None) -> EngramHasher | None:
    """The model's EngramHasher, or None without engram layers.

    The token map comes from `checkpoint_dir/tokenizer.json`; ids past the tokenizer's length
    (vocab padding) map to the pad token's compressed id. Without a tokenizer the identity map
    is used, which is only valid when engram_compressed_vocab_size == vocab_size.
    """
    import os

    if not cfg.engram_layer_ids:
        return None
    path = None if checkpoint_dir is None else os.path.join(checkpoint_dir, "tokenizer.json")
    if path is not None and os.path.exists(path):
        from tokenizers import Tokenizer

        table, vc = compressed_token_map(Tokenizer.from_file(path))
        if table.shape[0] < cfg.vocab_size:
            pad = table[cfg.engram_pad_token_id]
            table = torch.cat([table, pad.expand(cfg.vocab_size - table.shape[0])])
        return EngramHasher(cfg, table, vc)
    if cfg.engram_compressed_vocab_size != cfg.vocab_size:
        raise ValueError(
            "engram_compressed_vocab_size: no tokenizer.json to build the engram "
            "token map from, and the identity map needs it equal to vocab_size"
        )
    return EngramHasher(cfg, torch.arange(cfg.vocab_size), cfg.vocab_size)


def ngram_windows(input_ids: Tensor, positions: Tensor, max_ngram: int) -> tuple[Tensor, Tensor]:
    """Predecessor windows of one contiguous sequence.

    input_ids int64 [T] (a whole request or its suffix), positions int64 [T] (absolute).
    Returns tokens int64 [T, n] (column s = token t - s, 0 where unknown) and blocked bool
    [T, n] (True where position - s < 0, i.e. before the sequence start, or outside the
    given ids: a serving path with history must build windows itself).
    """
    T = input_ids.shape[0]
    s = torch.arange(max_ngram, device=input_ids.device)
    src = torch.arange(T, device=input_ids.device).unsqueeze(1) - s  # [T, n]
    blocked = (src < 0) | (positions.unsqueeze(1) - s < 0)
    tokens = input_ids[src.clamp(min=0)].masked_fill(blocked, 0)
    return tokens, blocked


def engram_hash_rows(
    tokens: Tensor,
    blocked: Tensor,
    token_map: Tensor,
    pad_compressed: int,
    mult: Tensor,
    primes: Tensor,
    offsets: Tensor,
) -> Tensor:
    """Table rows of one engram layer: int64 [T, (n-1) * heads], columns in (k, head) order.

    tokens int64 [T, n], blocked bool [T, n] (see ngram_windows); token_map int64 [vocab];
    mult int64 [n]; primes int64 [n-1, heads]; offsets int64 [(n-1) * heads].
    """
    w = torch.where(blocked, torch.full_like(tokens, pad_compressed), token_map[tokens])
    prod = w * mult  # [T, n], < 2^63 by the multiplier bound
    h, cols = prod[:, 0], []
    for k in range(1, tokens.shape[1]):
        h = torch.bitwise_xor(h, prod[:, k])
        cols.append(h.unsqueeze(1) % primes[k - 1])  # [T, heads]
    return torch.cat(cols, dim=1) + offsets


class EngramHasher(nn.Module):
    """Hash rows for every engram layer of a model from its config and token map.

    token_map int64 [vocab] (compressed ids, see compressed_token_map); its number of
    distinct ids must equal cfg.engram_compressed_vocab_size (it seeds every multiplier).
    forward(input_ids [T], positions [T]) -> int64 [T, n_engram_layers, (n-1) * heads].
    """

    def __init__(
        self, cfg: DeepseekV41Config, token_map: Tensor, compressed_vocab: int | None = None
    ):
        super().__init__()
        vc = int(token_map.max()) + 1 if compressed_vocab is None else compressed_vocab
        if vc != cfg.engram_compressed_vocab_size:
            raise ValueError(
                f"engram_compressed_vocab_size: the tokenizer compresses to {vc} "
                f"ids, config says {cfg.engram_compressed_vocab_size}"
            )
        layers, n = list(cfg.engram_layer_ids), cfg.engram_max_ngram_size
        primes = engram_primes(len(layers), n, cfg.engram_n_heads, cfg.engram_vocab_size)
        for j, layer in enumerate(layers):
            need = sum(sum(p) for p in primes[j])
            have = cfg.engram_num_embeddings[j] if j < len(cfg.engram_num_embeddings) else 0
            if have < need:
                raise ValueError(
                    f"engram_num_embeddings (layer {layer}): {have} rows, the hash needs {need}"
                )
        flat = torch.tensor(primes, dtype=torch.int64)  # [L, n-1, heads]
        offsets = torch.cumsum(flat.flatten(1), 1) - flat.flatten(1)  # [L, (n-1)*heads]
        mult = torch.stack([engram_multipliers(i, n, vc) for i in layers])  # [L, n]
        self.layer_ids, self.max_ngram = layers, n
        self.pad_compressed = int(token_map[cfg.engram_pad_token_id])
        self.register_buffer("token_map", token_map.to(torch.int64), persistent=False)
        self.register_buffer("primes", flat, persistent=False)
        self.register_buffer("offsets", offsets, persistent=False)
        self.register_buffer("mult", mult, persistent=False)

    def forward(self, input_ids: Tensor, positions: Tensor) -> Tensor:
        """One contiguous sequence (or a suffix whose earlier tokens are all given)."""
        tokens, blocked = ngram_windows(input_ids.long(), positions.long(), self.max_ngram)
        return self.rows_from_windows(tokens, blocked)

    def rows_from_windows(self, tokens: Tensor, blocked: Tensor) -> Tensor:
        """tokens int64 [T, n] (column s = the token s places back), blocked bool [T, n] (before
        the sequence start) -> int64 [T, n_engram_layers, (n-1) * heads]. A serving path builds
        the windows from each request's last n-1 token ids (its per-request history)."""
        return torch.stack(
            [
                engram_hash_rows(
                    tokens,
                    blocked,
                    self.token_map,
                    self.pad_compressed,
                    self.mult[j],
                    self.primes[j],
                    self.offsets[j],
                )
                for j in range(len(self.layer_ids))
            ],
            dim=1,
        )


def engram_gate(H: Tensor, kv: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float) -> Tensor:
    """H [T, S, d]; kv [T, (S+1) d] (S keys, then the value); q_weight, k_weight [S, d].
    Returns fp32 [T, S, d] = H + g * value with the per-stream gate g [T, S]."""
    T, S, d = H.shape
    key = upcast(kv[:, : S * d]).view(T, S, d)
    value = upcast(kv[:, S * d :])  # [T, d]
    h = upcast(H)
    rstd = torch.rsqrt(h.square().mean(-1) + eps) * torch.rsqrt(key.square().mean(-1) + eps)
    dot = (h * (upcast(q_weight) * upcast(k_weight)) * key).sum(-1) * rstd * d**-0.5  # [T, S]
    g = torch.sigmoid(torch.copysign(dot.abs().clamp(min=GATE_CLAMP).sqrt(), dot))
    return h + g.unsqueeze(-1) * value.unsqueeze(1)


class Engram(nn.Module):
    """One layer's Engram (checkpoint prefix `layers.{i}.engram.`), dense fp32 weights:
    embed.weight [rows, head_dim], wkv.weight [(S+1) d, (n-1) heads head_dim],
    q_weight [S, d], k_weight [S, d].
    forward(H [T, S, d], rows int64 [T, (n-1) * heads]) -> fp32 [T, S, d]."""

    def __init__(self, cfg: DeepseekV41Config, layer_id: int):
        super().__init__()
        idx = list(cfg.engram_layer_ids).index(layer_id)
        S, d, hd = cfg.hc_mult, cfg.hidden_size, cfg.engram_head_dim
        cols = (cfg.engram_max_ngram_size - 1) * cfg.engram_n_heads
        self.layer_id, self.hash_index, self.eps = layer_id, idx, cfg.rms_norm_eps
        self.embed = nn.Embedding(cfg.engram_num_embeddings[idx], hd)
        self.wkv = nn.Linear(cols * hd, (S + 1) * d, bias=False)
        self.q_weight = nn.Parameter(torch.ones(S, d))
        self.k_weight = nn.Parameter(torch.ones(S, d))

    def forward(self, H: Tensor, rows: Tensor) -> Tensor:
        e = upcast(self.embed.weight[rows]).flatten(1)  # [T, cols * head_dim]
        kv = stable_linear(e, upcast(self.wkv.weight))  # [T, (S+1) d]
        return engram_gate(H, kv, self.q_weight, self.k_weight, self.eps)
