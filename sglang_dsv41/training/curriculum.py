"""What the model sees at each training step: stages of lengths, facts and attention modes.

    stage   steps  prompt tokens  facts  attention
    dense   1000     256-768       2-6   every visible entry (encoder and decoder); the
                                         indexers learn by distillation beside it
    sparse  1600     256-2048      2-12  top-k everywhere, as served
    long     300    1024-4096      4-16  top-k everywhere, as served

Lengths are drawn log-uniformly per example; each example is raw or chat form (even odds),
asks 1-3 questions about its facts (each asked fact at a uniform depth), and runs its decoder
from the serving replay floor (prompt - window) or, half the time, from 6 windows before the
prompt's end, where the decoder rows see what the full forward would show them. The data of
step s is drawn from random.Random(f"{seed}:{s}"), so a resumed run sees the same examples.
`scale` multiplies every stage's steps (a short smoke run, or a longer one on a GPU).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from sglang_dsv41.training.examples import FORMS, Example, TaskTokenizer, encode_example
from sglang_dsv41.training.forward import SPARSE, Modes
from sglang_dsv41.training.task import make_document

FLOOR_WINDOWS = 6
"""Decoder rows from this many windows before the prompt's end see what the full forward shows
(the decoder has 6 layers: no row's window reaches below the floor through them)."""


@dataclass(frozen=True)
class Stage:
    name: str
    steps: int
    lengths: tuple
    facts: tuple
    modes: Modes


CURRICULUM = (
    Stage("dense", 1000, (256, 768), (2, 6), Modes(True, True)),
    Stage("sparse", 1600, (256, 2048), (2, 12), SPARSE),
    Stage("long", 300, (1024, 4096), (4, 16), SPARSE),
)


def scaled(curriculum: tuple, scale: float) -> tuple:
    return tuple(
        Stage(s.name, max(1, round(s.steps * scale)), s.lengths, s.facts, s.modes)
        for s in curriculum
    )


def total_steps(curriculum: tuple) -> int:
    return sum(s.steps for s in curriculum)


def stage_at(curriculum: tuple, step: int) -> Stage:
    for s in curriculum:
        if step < s.steps:
            return s
        step -= s.steps
    return curriculum[-1]


@dataclass
class Sample:
    """One training sequence: the example, its decoder floor and its attention modes."""

    example: Example
    floor: int
    modes: Modes
    n_tokens: int


def draw_sample(
    rng: random.Random, stage: Stage, tt: TaskTokenizer, filler: tuple, window: int
) -> Sample:
    lo, hi = stage.lengths
    n_tokens = round(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    n_facts = rng.randint(*stage.facts)
    doc = make_document(rng, filler, n_tokens, tt.count, n_facts, split="train")
    others = [j for j in range(n_facts) if j != doc.asked]
    more = tuple(rng.sample(others, min(len(others), rng.randint(0, 2))))
    ex = encode_example(tt, doc, rng.choice(FORMS), more)
    back = window if rng.random() < 0.5 else window * FLOOR_WINDOWS
    floor = max(0, ex.prompt_len - back)
    return Sample(ex, floor, stage.modes, n_tokens)


def step_samples(
    seed: int, step: int, stage: Stage, batch: int, tt: TaskTokenizer, filler: tuple, window: int
) -> list:
    rng = random.Random(f"{seed}:{step}")
    return [draw_sample(rng, stage, tt, filler, window) for _ in range(batch)]
