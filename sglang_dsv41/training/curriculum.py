"""What the model sees at each training step: stages of lengths, facts and attention modes.

    stage   steps  prompt tokens  facts  questions  encoder  decoder  supervised
    recall  1000     192-512       2-8   all (<= 8)  dense    dense    yes
    dense    600     256-1024      2-8   1-4         top-k    dense    yes
    sparse  1200     256-2048      2-12  1-3         top-k    top-k    no
    long     300    1024-4096      4-16  1-3         top-k    top-k    no
    polish   600     512-4096      2-16  1-3         top-k    top-k    yes, over the top-k

"dense" attends every visible main-KV entry, "top-k" is the served selection (candidate pool
included); the indexers learn by distillation in every stage (training.distill), and
"supervised" adds the attention supervision of the decoder's Full layer (training.supervision);
the polish stage (train.py --polish, at the final learning rate) follows the curriculum.
Lengths are drawn log-uniformly per example; each example is raw or chat form (even odds),
asks questions about distinct facts of its document (the first at a uniform depth; the
others follow it, each answered: more signal for one pass of the encoder), and runs its decoder
from the serving replay floor (prompt - window) or, half the time, from 6 windows before the
prompt's end, where the decoder rows see what the full forward would show them. The data of
step s is drawn from random.Random(f"{seed}:{s}"), so a resumed run sees the same examples.
`scale` multiplies every stage's steps (a short smoke run, or a longer one on a GPU).
"""

from __future__ import annotations

import dataclasses
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
    questions: tuple
    modes: Modes
    supervise: float = 0.0


CURRICULUM = (
    Stage("recall", 1000, (192, 512), (2, 8), (8, 8), Modes(True, True), supervise=1.0),
    Stage("dense", 600, (256, 1024), (2, 8), (1, 4), Modes(False, True), supervise=1.0),
    Stage("sparse", 1200, (256, 2048), (2, 12), (1, 3), SPARSE),
    Stage("long", 300, (1024, 4096), (4, 16), (1, 3), SPARSE),
)


POLISH_STEPS = 600
"""Steps of the polish stage in the shipped recipe (train.py --polish; the shipped weights
stopped after 300 of them)."""

POLISH_SUPERVISE = 1.0
"""Weight of the attention supervision over the top-k in the shipped recipe's polish stage
(train.py --polish-supervise)."""


def polish_stage(steps: int, supervise: float = 0.0) -> tuple:
    """The stage after the curriculum: served attention over 512-4096 tokens, at the final
    learning rate; `supervise` weighs the attention supervision over the decoder's top-k."""
    return (Stage("polish", steps, (512, 4096), (2, 16), (1, 3), SPARSE, supervise),)


def scaled(curriculum: tuple, scale: float) -> tuple:
    return tuple(dataclasses.replace(s, steps=max(1, round(s.steps * scale))) for s in curriculum)


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
    more = tuple(rng.sample(others, min(len(others), rng.randint(*stage.questions) - 1)))
    ex = encode_example(tt, doc, rng.choice(FORMS), more)
    back = window if rng.random() < 0.5 else window * FLOOR_WINDOWS
    floor = max(0, ex.prompt_len - back)
    return Sample(ex, floor, stage.modes, n_tokens)


def step_samples(
    seed: int, step: int, stage: Stage, batch: int, tt: TaskTokenizer, filler: tuple, window: int
) -> list:
    rng = random.Random(f"{seed}:{step}")
    return [draw_sample(rng, stage, tt, filler, window) for _ in range(batch)]
