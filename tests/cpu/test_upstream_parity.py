"""mHC and Engram against SGLang 0.5.23's in-tree torch paths (read for facts, never copied).

Guards the facts docs/design.md 2.6 and docs/release_format.md take from public ports: the
mixing/Sinkhorn split, the compressed token map, primes, multipliers, hash rows and the Engram gate.
"""

import numpy as np
import pytest
import torch

from sglang_dsv41.layers import engram as ours
from sglang_dsv41.layers.mhc import hc_mix

up_mhc = pytest.importorskip("sglang.test.kernels.mhc")
up = pytest.importorskip("sglang.srt.layers.engram")


def test_mhc_split_sinkhorn():
    g = torch.Generator().manual_seed(0)
    T, S, d = 64, 4, 32
    H = torch.randn(T, S, d, generator=g)
    fn = torch.randn(24, S * d, generator=g) * 0.2
    base, scale = torch.randn(24, generator=g), torch.rand(3, generator=g) + 0.5
    pre, post, C = hc_mix(H, fn, base, scale, iters=20, hc_eps=1e-6, rms_eps=1e-20)
    x = H.flatten(1)
    mixes = (x @ fn.t()) * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-20)
    p2, q2, c2 = up_mhc.hc_split_sinkhorn_torch(mixes.unsqueeze(0), scale, base, 4, 20, 1e-6)
    torch.testing.assert_close(pre, p2[0])
    torch.testing.assert_close(post, q2[0])
    torch.testing.assert_close(C, c2[0])


def test_engram_layout_and_hash():
    class Cfg:
        engram_layer_ids, engram_max_ngram_size, engram_n_heads = [1, 14], 4, 8
        engram_vocab_size, engram_num_embeddings, engram_head_dim = 16_000_000, [0, 0], 256

    layout = up.EngramLayout.from_config(Cfg)
    assert [[list(k) for k in layer] for layer in layout.primes] == ours.engram_primes(
        2, 4, 8, 16_000_000
    )
    want = up.compute_hash_multipliers((1, 14), 4, 99092)
    assert torch.equal(want, torch.stack([ours.engram_multipliers(i, 4, 99092) for i in (1, 14)]))

    g = torch.Generator().manual_seed(1)
    token_map = torch.randint(0, 300, (512,), generator=g)
    token_map[:300] = torch.arange(300)
    ids = torch.randint(0, 512, (50,), generator=g)
    tok, blk = ours.ngram_windows(ids, torch.arange(50), 4)
    primes = ours.engram_primes(2, 4, 2, 61)
    flat = [[p for k in layer for p in k] for layer in primes]
    offsets = torch.tensor(np.array([np.cumsum([0, *s[:-1]]) for s in flat]))
    mult = up.compute_hash_multipliers((1, 14), 4, 300)
    theirs = up.compute_engram_hash_ids(
        tok, blk, int(token_map[2]), token_map, mult, torch.tensor(primes), offsets
    )

    class Mini:
        engram_layer_ids, engram_max_ngram_size, engram_n_heads = [1, 14], 4, 2
        engram_vocab_size, engram_compressed_vocab_size, engram_pad_token_id = 61, 300, 2
        engram_num_embeddings = [sum(s) for s in flat]

    assert torch.equal(ours.EngramHasher(Mini, token_map, 300)(ids, torch.arange(50)), theirs)


def test_compressed_token_map(tmp_path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from sglang_dsv41.tools.tokenizer import save_tokenizer

    save_tokenizer(tmp_path, 512, 4096)
    lookup, n = up.build_compressed_token_map(AutoTokenizer.from_pretrained(str(tmp_path)))
    table, n2 = ours.compressed_token_map(Tokenizer.from_file(str(tmp_path / "tokenizer.json")))
    assert n == n2 and table.tolist() == lookup


def test_engram_gate():
    g = torch.Generator().manual_seed(2)
    T, S, d = 16, 4, 32
    H, kv = torch.randn(T, S, d, generator=g), torch.randn(T, (S + 1) * d, generator=g)
    qw, kw = torch.randn(S, d, generator=g), torch.randn(S, d, generator=g)
    torch.testing.assert_close(
        ours.engram_gate(H, kv, qw, kw, 1e-20), up.engram_gate(H, kv, qw, kw, 1e-20, 1e-6)
    )
