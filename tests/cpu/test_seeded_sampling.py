"""The CPU seeded sampler: murmur3_32 equals MurmurHash3_x86_32 (a scalar implementation of the
published algorithm, checked on its published test vectors), and the Gumbel argmax is a draw
from softmax(logprobs) that depends only on (seed, position)."""

from __future__ import annotations

import struct

import torch

from sglang_dsv41.sglang.deterministic import gumbel_argmax, murmur3_32


def murmur3_x86_32(data: bytes, seed: int = 0) -> int:
    """Scalar MurmurHash3_x86_32, written from the published algorithm."""
    c1, c2, m = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    h = seed
    n = len(data) // 4 * 4
    for i in range(0, n, 4):
        (k,) = struct.unpack_from("<I", data, i)
        k = (k * c1) & m
        k = ((k << 15) | (k >> 17)) & m
        h ^= (k * c2) & m
        h = ((h << 13) | (h >> 19)) & m
        h = (h * 5 + 0xE6546B64) & m
    tail = data[n:]
    k = 0
    for j, b in enumerate(tail):
        k |= b << (8 * j)
    if tail:
        k = (k * c1) & m
        k = ((k << 15) | (k >> 17)) & m
        h ^= (k * c2) & m
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & m
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & m
    return h ^ (h >> 16)


def test_scalar_reference_on_published_vectors():
    assert murmur3_x86_32(b"", 0) == 0
    assert murmur3_x86_32(b"", 1) == 0x514E28B7
    assert murmur3_x86_32(b"test", 0) == 0xBA6BD213
    fox = b"The quick brown fox jumps over the lazy dog"
    assert murmur3_x86_32(fox, 0x9747B28C) == 0x2FA826CD


def test_murmur3_32_equals_the_scalar_hash():
    seeds = torch.tensor([0, 1, 42, -1, 2**63 - 1, -(2**40) + 7])
    positions = torch.tensor([0, 5, 4095, 17, 1, 2**31])
    cols = torch.tensor([0, 1, 2, 511, 129279, 2**32 - 1])
    got = murmur3_32(seeds, positions, cols)
    for i, (s, p) in enumerate(zip(seeds.tolist(), positions.tolist(), strict=True)):
        for j, c in enumerate(cols.tolist()):
            key = struct.pack("<IIII", s & 0xFFFFFFFF, (s >> 32) & 0xFFFFFFFF, p, c)
            assert int(got[i, j]) == murmur3_x86_32(key, 0), (s, p, c)


def test_gumbel_argmax_is_seeded_and_follows_the_distribution():
    g = torch.Generator().manual_seed(0)
    logprobs = torch.log_softmax(torch.randn(1, 8, generator=g, dtype=torch.float64), -1)
    rows = 4000
    lp = logprobs.expand(rows, 8)
    pos = torch.arange(rows)
    a = gumbel_argmax(lp, torch.full((rows,), 7), pos).view(-1)
    assert torch.equal(a, gumbel_argmax(lp, torch.full((rows,), 7), pos).view(-1))
    assert not torch.equal(a, gumbel_argmax(lp, torch.full((rows,), 8), pos).view(-1))
    freq = torch.bincount(a, minlength=8).double() / rows
    assert (freq - logprobs.exp().view(-1)).abs().max() < 0.03, (freq, logprobs.exp())
