"""Engram: the reference's hash check values, hashing and gate against scalar loops."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sglang_dsv41.layers.engram import (
    Engram,
    EngramHasher,
    compressed_token_map,
    engram_gate,
    engram_multipliers,
    engram_primes,
    is_prime,
    ngram_windows,
)

# V4.1-Flash: engram layers [1, 14], 4-token windows (2..4-grams), 8 heads, tables from 16M.
FLASH = dict(layers=[1, 14], n=4, heads=8, vocab=16_000_000, compressed=99092)


def _cfg(**kw):
    base = dict(
        engram_layer_ids=[1, 3],
        engram_max_ngram_size=3,
        engram_n_heads=2,
        engram_vocab_size=50,
        engram_compressed_vocab_size=40,
        engram_pad_token_id=2,
        engram_head_dim=8,
        hc_mult=4,
        hidden_size=16,
        rms_norm_eps=1e-6,
    )
    base.update(kw)
    primes = engram_primes(
        len(base["engram_layer_ids"]),
        base["engram_max_ngram_size"],
        base["engram_n_heads"],
        base["engram_vocab_size"],
    )
    base.setdefault("engram_num_embeddings", [sum(sum(p) for p in pl) for pl in primes])
    return SimpleNamespace(**base)


def test_flash_check_values():
    primes = engram_primes(2, FLASH["n"], FLASH["heads"], FLASH["vocab"])
    l1 = [p for k in primes[0] for p in k]
    l14 = [p for k in primes[1] for p in k]
    assert len(l1) == len(l14) == 24
    assert (l1[0], l1[-1]) == (16000057, 16000463)
    assert (l14[0], l14[-1]) == (16000477, 16000889)
    assert l1 + l14 == sorted(set(l1 + l14)) and all(is_prime(p) for p in l1 + l14)
    mult = engram_multipliers(1, FLASH["n"], FLASH["compressed"]).tolist()
    assert mult == [76632096046245, 4839876093313, 35959672319349, 73987337458391]
    assert all(m % 2 == 1 for m in engram_multipliers(14, 4, FLASH["compressed"]).tolist())
    assert sum(l1) == 384006168  # rows of layer 1's table (~384M, docs/release_format.md)


def test_is_prime_small():
    want = [n for n in range(2, 3000) if all(n % d for d in range(2, int(n**0.5) + 1))]
    assert [n for n in range(3000) if is_prime(n)] == want


def test_primes_are_the_next_ones_after_vocab():
    p = engram_primes(1, 3, 2, 50)
    assert p == [[[53, 59], [61, 67]]]


def test_windows_and_blocking():
    ids = torch.tensor([5, 6, 7, 8])
    tok, blk = ngram_windows(ids, torch.arange(4), 3)
    assert tok.tolist() == [[5, 0, 0], [6, 5, 0], [7, 6, 5], [8, 7, 6]]
    assert blk.tolist() == [[False, True, True], [False, False, True]] + [[False] * 3] * 2


def test_hash_rows_match_scalar_loop():
    cfg = _cfg()
    g = torch.Generator().manual_seed(0)
    token_map = torch.randint(0, 40, (60,), generator=g)
    token_map[:40] = torch.arange(40)  # every compressed id used: 40 distinct
    hasher = EngramHasher(cfg, token_map)
    ids = torch.randint(0, 60, (17,), generator=g)
    rows = hasher(ids, torch.arange(17))  # [T, 2 layers, 2 * 2]
    primes = engram_primes(2, 3, 2, 50)
    pad = int(token_map[2])
    for li, layer in enumerate(cfg.engram_layer_ids):
        mult = engram_multipliers(layer, 3, 40).tolist()
        flat = [p for k in primes[li] for p in k]
        offs = [sum(flat[:c]) for c in range(len(flat))]
        for t in range(17):
            w = [int(token_map[ids[t - s]]) if t - s >= 0 else pad for s in range(3)]
            want, c, h = [], 0, w[0] * mult[0]
            for k in range(1, 3):
                h ^= w[k] * mult[k]
                for _head in range(2):
                    want.append(h % flat[c] + offs[c])
                    c += 1
            assert rows[t, li].tolist() == want
            assert all(0 <= r < cfg.engram_num_embeddings[li] for r in want)


def test_hasher_rejects_wrong_config():
    token_map = torch.arange(40)
    with pytest.raises(ValueError, match="engram_compressed_vocab_size"):
        EngramHasher(_cfg(engram_compressed_vocab_size=41), token_map)
    with pytest.raises(ValueError, match="engram_num_embeddings"):
        EngramHasher(_cfg(engram_num_embeddings=[100, 100]), token_map)


def test_compressed_token_map_normalizes():
    from tokenizers import Tokenizer, models

    vocab = {"Hello": 0, "hello": 1, "HÉLLO": 2, " ": 3, "  ": 4, "x": 5, "\u00e9": 6, "e": 7}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="x"))
    table, n = compressed_token_map(tok)
    t = table.tolist()
    assert t[0] == t[1] == t[2]  # case and accents fold
    assert t[3] == t[4] != t[0]  # whitespace runs collapse to one kept space
    assert t[6] == t[7] and t[5] not in (t[0], t[3], t[6])
    assert n == len(set(t)) == 4 and t[0] == 0  # first-seen numbering


def test_gate_matches_scalar_loop():
    g = torch.Generator().manual_seed(1)
    T, S, d = 3, 4, 8
    H = torch.randn(T, S, d, generator=g)
    kv = torch.randn(T, (S + 1) * d, generator=g)
    qw, kw = torch.rand(S, d, generator=g) + 0.5, torch.randn(S, d, generator=g)
    out = engram_gate(H, kv, qw, kw, 1e-6)
    for t in range(T):
        v = kv[t, S * d :]
        for j in range(S):
            h, k = H[t, j].tolist(), kv[t, j * d : (j + 1) * d].tolist()
            rh = 1 / math.sqrt(sum(x * x for x in h) / d + 1e-6)
            rk = 1 / math.sqrt(sum(x * x for x in k) / d + 1e-6)
            dot = sum(h[c] * qw[j, c].item() * kw[j, c].item() * k[c] for c in range(d))
            dot *= rh * rk / math.sqrt(d)
            gate = 1 / (1 + math.exp(-math.copysign(math.sqrt(max(abs(dot), 1e-6)), dot)))
            torch.testing.assert_close(out[t, j], H[t, j] + gate * v, atol=1e-5, rtol=1e-5)


def test_engram_module_shapes():
    cfg = _cfg()
    m = Engram(cfg, 3)
    assert m.embed.weight.shape == (cfg.engram_num_embeddings[1], 8)
    assert m.wkv.weight.shape == (5 * 16, 4 * 8)
    H = torch.randn(5, 4, 16)
    rows = torch.randint(0, cfg.engram_num_embeddings[1], (5, 4))
    assert m(H, rows).shape == (5, 4, 16)


def test_numpy_rng_is_the_source():
    """The multipliers are numpy's default_rng draws (seed 10007 * layer), not torch's."""
    bound = (np.iinfo(np.int64).max // 99092) // 2
    draws = np.random.default_rng(10007 * 14).integers(0, bound, size=4, dtype=np.int64)
    assert engram_multipliers(14, 4, 99092).tolist() == (draws * 2 + 1).tolist()
