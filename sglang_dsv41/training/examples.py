"""Token sequences of the retrieval task, as a server sees them, with the positions to learn.

raw   [bos] tok(raw prompt) A1 [then "\\n" Q2 "\\n" A2 ...] [eos]
chat  [bos] <User> tok(content) <Assistant> </think> A1 [eos] [<User> tok(Q2) <Assistant>
      </think> A2 [eos] ...]
A = the six digit tokens of the code (the tokenizer splits digits one per token). The prompt is
tokenized whole, exactly as `/v1/completions` does (bos prepended), and the chat form equals
the checkpoint's chat template tokenized without added specials: every piece boundary sits at a
special token or a digit, where byte-level BPE never merges across. Later questions (a training
device: more retrieval per document) ask about other facts of the same document. Targets are
the answer digits and the eos closing the raw sequence or each chat answer. Each digit target
also names its source: the position of the same digit in the asked fact's line of the prompt,
where a retrieving attention should look (`training.supervision`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sglang_dsv41.tools.tokenizer import BOS, EOS, SPECIAL_TOKENS
from sglang_dsv41.training.task import Document, question_line

FORMS = ("raw", "chat")
USER, ASSISTANT, THINK_END = (
    SPECIAL_TOKENS.index(s) for s in ("<｜User｜>", "<｜Assistant｜>", "</think>")
)
BOS_ID, EOS_ID = SPECIAL_TOKENS.index(BOS), SPECIAL_TOKENS.index(EOS)


@dataclass
class Example:
    """ids: int token ids [L]; rows: positions whose next token is a target; targets: those
    tokens; sources: per target, the prompt position of the fact's digit it copies (-1 for an
    eos); prompt_len: tokens of the first prompt (what a server prefills before answering)."""

    ids: list
    rows: list
    targets: list
    sources: list
    prompt_len: int


class TaskTokenizer:
    """A `tokenizers.Tokenizer` (the checkpoint's) with the counts the generator needs."""

    def __init__(self, tok):
        self.tok = tok
        self._count = lru_cache(maxsize=1 << 16)(self._len)

    def _len(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def count(self, text: str) -> int:
        return self._count(text)

    def encode(self, text: str) -> list:
        return self.tok.encode(text, add_special_tokens=False).ids


def encode_example(tt: TaskTokenizer, doc: Document, form: str, more: tuple = ()) -> Example:
    """doc's prompt in `form` ("raw" | "chat") with its answer, then a question and answer for
    each fact index in `more`."""
    if form not in FORMS:
        raise ValueError(f"form {form!r}: one of {FORMS}")
    ids: list = [BOS_ID]
    rows: list = []
    targets: list = []
    sources: list = []

    def answer(code: str):
        digits = tt.encode(code)
        at = find_run(ids[:prompt_len], digits)
        for k, d in enumerate(digits):
            rows.append(len(ids) - 1)
            targets.append(d)
            sources.append(at + k)
            ids.append(d)

    def close():
        rows.append(len(ids) - 1)
        targets.append(EOS_ID)
        sources.append(-1)
        ids.append(EOS_ID)

    if form == "raw":
        ids += tt.encode(doc.raw_prompt())
    else:
        ids += [USER] + tt.encode(doc.chat_content()) + [ASSISTANT, THINK_END]
    prompt_len = len(ids)
    answer(doc.code)
    for j in more:
        name, code = doc.facts[j]
        if form == "raw":
            ids += tt.encode("\n" + question_line(name) + "\n")
        else:
            close()
            ids += [USER] + tt.encode(question_line(name)) + [ASSISTANT, THINK_END]
        answer(code)
    close()
    return Example(ids, rows, targets, sources, prompt_len)


def find_run(ids: list, run: list) -> int:
    """The one position where `run` occurs in `ids` (a code's digits in its fact line: filler has
    no run of four digits and codes are distinct); ValueError otherwise."""
    n = len(run)
    hits = [p for p in range(len(ids) - n + 1) if ids[p : p + n] == run]
    if len(hits) != 1:
        raise ValueError(f"digit run {run} occurs {len(hits)} times in the prompt, expected once")
    return hits[0]
