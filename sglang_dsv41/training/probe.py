"""A quick held-out check during training: exact answers by teacher forcing, served attention.

Documents from the held-out filler with evaluation names, raw form, one question, the asked
fact at depths spread evenly over 0..1; each answered as `training.model_eval` answers (the
training forward in sparse mode from the serving replay floor): an answer counts when all six
digit tokens are the argmax given the previous digits, exactly when greedy decoding writes the
code.
"""

from __future__ import annotations

import random

from sglang_dsv41.training.examples import TaskTokenizer
from sglang_dsv41.training.filler import HELD_OUT_SOURCE, filler_lines
from sglang_dsv41.training.model_eval import answer_ok
from sglang_dsv41.training.task import make_document


def probe_set(tt: TaskTokenizer, lengths, per_length: int, n_facts: int, seed: int = 1) -> list:
    """-> [(length, Document)]: per length, per_length documents at evenly spread depths."""
    rng = random.Random(f"probe:{seed}")
    filler = filler_lines(HELD_OUT_SOURCE)
    out = []
    for n in lengths:
        for k in range(per_length):
            depth = k / max(1, per_length - 1)
            out.append((n, make_document(rng, filler, n, tt.count, n_facts, depth, "eval")))
    return out


def probe_accuracy(model, tt: TaskTokenizer, samples: list, device="cpu") -> dict:
    """samples from probe_set -> {length: share of exact answers}."""
    hits: dict = {}
    for n, doc in samples:
        hits.setdefault(n, []).append(answer_ok(model, tt, doc, True, device)[0])
    return {n: sum(v) / len(v) for n, v in hits.items()}
