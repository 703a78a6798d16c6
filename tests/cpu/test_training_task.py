"""The retrieval task's data: line formats, documents, filler sources, token sequences."""

from __future__ import annotations

import random
import re

import pytest

from sglang_dsv41.tools.tokenizer import CHAT_TEMPLATE, train_tokenizer
from sglang_dsv41.training.examples import EOS_ID, TaskTokenizer, encode_example
from sglang_dsv41.training.filler import HELD_OUT_SOURCE, TRAIN_SOURCE, filler_lines
from sglang_dsv41.training.task import (
    ANSWER,
    fact_line,
    first_code,
    make_document,
    name_split,
    question_line,
    random_name,
)

FACT = re.compile(r"^the code of ([a-z]{3,10}) is (\d{6})\.$")


@pytest.fixture(scope="module")
def tt():
    return TaskTokenizer(train_tokenizer(512))


def test_lines_and_answer_parsing():
    assert fact_line("abc", "012345") == "the code of abc is 012345."
    assert question_line("abc") == "what is the code of abc?"
    assert first_code(" 012345\n") == "012345"
    assert first_code("0123 45xyz9") == "012345"
    assert first_code("01234") is None and first_code("") is None
    assert ANSWER.fullmatch("000000")


def test_name_split_is_a_partition():
    rng = random.Random(0)
    train = {random_name(rng, "train") for _ in range(300)}
    held = {random_name(rng, "eval") for _ in range(300)}
    assert not train & held
    assert all(name_split(n) == "train" for n in train)
    assert all(name_split(n) == "eval" for n in held)
    assert all(re.fullmatch(r"[a-z]{3,10}", n) for n in train | held)


def test_filler_sources_are_prose_and_disjoint():
    train, held = filler_lines(TRAIN_SOURCE), filler_lines(HELD_OUT_SOURCE)
    assert len(train) > 2000 and len(held) > 2000
    assert not set(train) & set(held)
    for line in train + held:
        assert 24 <= len(line) <= 96 and line.isascii()
        assert "code of" not in line.lower() and not re.search(r"\d{4}", line)


@pytest.mark.parametrize("n_tokens,n_facts,depth", [(256, 2, 0.0), (1024, 4, 0.5), (4096, 9, 1.0)])
def test_document_shape(tt, n_tokens, n_facts, depth):
    rng = random.Random(n_tokens)
    doc = make_document(rng, filler_lines(TRAIN_SOURCE), n_tokens, tt.count, n_facts, depth)
    facts = [FACT.match(line) for line in doc.lines]
    assert sum(m is not None for m in facts) == n_facts
    assert [i for i, m in enumerate(facts) if m] == doc.fact_lines
    assert [(m[1], m[2]) for m in facts if m] == doc.facts
    assert len({n for n, _ in doc.facts}) == n_facts and len({c for _, c in doc.facts}) == n_facts
    assert doc.depth == pytest.approx(depth, abs=1.0 / len(doc.lines))
    prompt = doc.raw_prompt()
    assert prompt == "\n".join(doc.lines) + f"\nwhat is the code of {doc.name}?\n"
    assert doc.chat_content() == prompt[:-1]
    n = len(tt.encode(prompt))
    longest = max(tt.count(line) for line in doc.lines)  # the budget is overrun by one line
    assert n_tokens - 4 <= n <= n_tokens + longest + 4, n


def test_raw_example_matches_the_served_tokenization(tt):
    rng = random.Random(3)
    doc = make_document(rng, filler_lines(TRAIN_SOURCE), 300, tt.count, 3)
    ex = encode_example(tt, doc, "raw", more=(1 if doc.asked != 1 else 0,))
    served = tt.tok.encode(doc.raw_prompt()).ids  # bos added, as /v1/completions does
    assert ex.ids[: ex.prompt_len] == served
    digits = tt.encode(doc.code)
    assert len(digits) == 6
    assert ex.targets[:6] == digits and ex.rows[0] == ex.prompt_len - 1
    assert [ex.ids[r + 1] for r in ex.rows] == ex.targets
    assert ex.targets[-1] == EOS_ID and len(ex.targets) == 13
    # every digit target names the same digit inside its fact's line of the prompt
    assert ex.sources[-1] == -1 and all(s < ex.prompt_len for s in ex.sources)
    assert [ex.ids[s] for s in ex.sources[:-1]] == ex.targets[:-1]
    line = tt.encode(fact_line(doc.name, doc.code))
    assert ex.ids[ex.sources[0] - len(line) + 7 : ex.sources[5] + 2] == line


def test_chat_example_matches_the_chat_template(tt):
    import jinja2

    rng = random.Random(4)
    doc = make_document(rng, filler_lines(TRAIN_SOURCE), 300, tt.count, 3)
    other = 1 if doc.asked != 1 else 0
    ex = encode_example(tt, doc, "chat", more=(other,))
    name, code = doc.facts[other]
    messages = [
        {"role": "user", "content": doc.chat_content()},
        {"role": "assistant", "content": doc.code},
        {"role": "user", "content": question_line(name)},
        {"role": "assistant", "content": code},
    ]
    env = jinja2.Environment()
    text = env.from_string(CHAT_TEMPLATE).render(
        messages=messages, bos_token=tt.tok.id_to_token(0), eos_token=tt.tok.id_to_token(1)
    )
    assert ex.ids == tt.encode(text)
    prompt = env.from_string(CHAT_TEMPLATE).render(
        messages=messages[:1], add_generation_prompt=True, bos_token=tt.tok.id_to_token(0)
    )
    assert ex.ids[: ex.prompt_len] == tt.encode(prompt)
    assert [ex.ids[r + 1] for r in ex.rows] == ex.targets and len(ex.targets) == 14
