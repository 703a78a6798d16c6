"""The retrieval task: a document of lines, some of them facts, and a question about one fact.

    fact      "the code of NAME is DDDDDD."     NAME 3-10 lowercase ASCII letters, D digits
    question  "what is the code of NAME?"
    raw form  the document's lines joined by newlines, a newline, the question, a newline;
              the answer is the first six digits the model writes (`/v1/completions`)
    chat form one user message: the document's lines, a newline, the question; the answer is
              the first six digits of the reply

A document holds several facts (distinct names and codes) among filler lines
(`training.filler`); the asked fact sits at a chosen depth: 0.0 puts it on the first line,
1.0 on the last. Names are split in two by a hash (`name_split`): training draws only
"train" names, evaluation only "eval" names, so evaluation asks about names never trained on.
Sizes are in tokens of the model's tokenizer (`count_tokens`).
"""

from __future__ import annotations

import random
import re
import zlib
from dataclasses import dataclass

NAME_MIN, NAME_MAX = 3, 10
CODE_DIGITS = 6
EVAL_NAME_EVERY = 8
"""One name in EVAL_NAME_EVERY (by crc32) is reserved for evaluation."""
ANSWER = re.compile(r"\d{6}")


def fact_line(name: str, code: str) -> str:
    return f"the code of {name} is {code}."


def question_line(name: str) -> str:
    return f"what is the code of {name}?"


def name_split(name: str) -> str:
    """ "eval" for the names reserved for evaluation, "train" for the others."""
    return "eval" if zlib.crc32(name.encode()) % EVAL_NAME_EVERY == 0 else "train"


def random_name(rng: random.Random, split: str) -> str:
    while True:
        n = rng.randint(NAME_MIN, NAME_MAX)
        name = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))
        if name_split(name) == split:
            return name


def random_code(rng: random.Random) -> str:
    return "".join(rng.choice("0123456789") for _ in range(CODE_DIGITS))


def first_code(text: str) -> str | None:
    """The answer a model wrote: the first six digits of its text (digits in a row), or None."""
    digits = re.sub(r"\D", "", text)
    return digits[:CODE_DIGITS] if len(digits) >= CODE_DIGITS else None


@dataclass
class Document:
    """lines: the document's lines (filler and facts); facts: (name, code) in line order;
    fact_lines: the line index of each fact; asked: index into facts of the question."""

    lines: list
    facts: list
    fact_lines: list
    asked: int

    @property
    def name(self) -> str:
        return self.facts[self.asked][0]

    @property
    def code(self) -> str:
        return self.facts[self.asked][1]

    @property
    def question(self) -> str:
        return question_line(self.name)

    @property
    def depth(self) -> float:
        """Line of the asked fact / last line (0.0 first line, 1.0 last line)."""
        return self.fact_lines[self.asked] / max(1, len(self.lines) - 1)

    def raw_prompt(self) -> str:
        return "\n".join(self.lines) + "\n" + self.question + "\n"

    def chat_content(self) -> str:
        return "\n".join(self.lines) + "\n" + self.question


def make_document(
    rng: random.Random,
    filler: tuple,
    n_tokens: int,
    count_tokens,
    n_facts: int,
    depth: float | None = None,
    split: str = "train",
) -> Document:
    """A document whose raw prompt has about n_tokens tokens (within one filler line).

    filler: tuple of str lines (a contiguous run from a random start, wrapping around);
    count_tokens: str -> int (the tokenizer, without specials); depth: where the asked fact goes
    (None = uniform over the lines); the other facts go on random lines.
    """
    names: list = []
    while len(names) < n_facts:
        name = random_name(rng, split)
        if name not in names:
            names.append(name)
    codes: list = []
    while len(codes) < n_facts:
        code = random_code(rng)
        if code not in codes:
            codes.append(code)
    asked = rng.randrange(n_facts)
    fixed = sum(count_tokens(fact_line(n, c)) + 1 for n, c in zip(names, codes, strict=True))
    budget = n_tokens - fixed - count_tokens(question_line(names[asked])) - 2
    body: list = []
    at = rng.randrange(len(filler))
    used = 0
    while used < budget:
        line = filler[at % len(filler)]
        body.append(line)
        used += count_tokens(line) + 1
        at += 1
        if len(body) > len(filler):
            raise ValueError(f"filler has too few lines for {n_tokens} tokens")
    total = len(body) + n_facts
    target = rng.randrange(total) if depth is None else round(depth * (total - 1))
    others = rng.sample([i for i in range(total) if i != target], n_facts - 1)
    slots = sorted([target] + others)
    fact_at = {}
    order = [j for j in range(n_facts) if j != asked]
    for line_no in slots:
        fact_at[line_no] = asked if line_no == target else order.pop()
    lines, facts, fact_lines, it = [], [], [], iter(body)
    for line_no in range(total):
        if line_no in fact_at:
            j = fact_at[line_no]
            if j == asked:
                new_asked = len(facts)
            facts.append((names[j], codes[j]))
            fact_lines.append(line_no)
            lines.append(fact_line(names[j], codes[j]))
        else:
            lines.append(next(it))
    return Document(lines, facts, fact_lines, new_asked)
