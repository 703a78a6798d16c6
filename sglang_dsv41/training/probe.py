"""A quick held-out check during training: exact answers by teacher forcing, served attention.

Documents from the held-out filler with evaluation names, raw form, one question, the asked
fact at depths spread evenly over 0..1; the training forward in sparse mode (as served) from
the serving replay floor. An answer counts when all six digit tokens are the argmax given the
previous digits, which is exactly when greedy decoding writes the code.
"""

from __future__ import annotations

import random

import torch

from sglang_dsv41.training.examples import TaskTokenizer, encode_example
from sglang_dsv41.training.filler import HELD_OUT_SOURCE, filler_lines
from sglang_dsv41.training.forward import SPARSE, train_forward
from sglang_dsv41.training.task import CODE_DIGITS, make_document


def probe_set(tt: TaskTokenizer, lengths, per_length: int, n_facts: int, seed: int = 1) -> list:
    """-> [(length, Example)]: per length, per_length documents at evenly spread depths."""
    rng = random.Random(f"probe:{seed}")
    filler = filler_lines(HELD_OUT_SOURCE)
    out = []
    for n in lengths:
        for k in range(per_length):
            depth = k / max(1, per_length - 1)
            doc = make_document(rng, filler, n, tt.count, n_facts, depth=depth, split="eval")
            out.append((n, encode_example(tt, doc, "raw")))
    return out


@torch.no_grad()
def probe_accuracy(model, samples: list, window: int, device="cpu") -> dict:
    """samples from probe_set -> {length: share of exact answers}."""
    hits: dict = {}
    for n, ex in samples:
        ids = torch.tensor(ex.ids, dtype=torch.int64, device=device)
        rows = torch.tensor(ex.rows[:CODE_DIGITS], dtype=torch.int64, device=device)
        floor = max(0, ex.prompt_len - window)
        logits, _ = train_forward(model, ids, rows, floor, SPARSE)
        want = torch.tensor(ex.targets[:CODE_DIGITS], device=device)
        ok = bool((logits.argmax(-1) == want).all())
        hits.setdefault(n, []).append(ok)
    return {n: sum(v) / len(v) for n, v in hits.items()}
