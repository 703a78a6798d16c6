"""The shipped retrieval model through a running CPU server: it answers the README's question,
and retrieval_eval finds it right on held-out filler and unseen names, replay on and off."""

from __future__ import annotations

import json

import pytest
from e2e.server import Server, post

from sglang_dsv41.tools import retrieval_eval
from sglang_dsv41.tools.serve import RETRIEVAL_DIR

DOC = (
    "The river ran low that summer.\n"
    "the code of amber is 418207.\n"
    "Children walked across it without getting their knees wet.\n"
    "the code of quill is 905361.\n"
    "Nobody believed the old ferryman, but everybody listened.\n"
)
"""The README's first request: a short document with two facts."""


@pytest.fixture(scope="module", params=["replay", "no-replay"])
def server(request, tmp_path_factory):
    args = () if request.param == "replay" else ("--no-enable-decoder-swa-bounded-replay",)
    log = tmp_path_factory.mktemp("logs") / f"retrieval-{request.param}.log"
    s = Server(str(RETRIEVAL_DIR), str(log), args)
    yield s
    s.stop()


def test_readme_question(server):
    status, out = post(
        server.url + "/v1/completions",
        {"prompt": DOC + "what is the code of quill?\n", "max_tokens": 8, "temperature": 0},
    )
    assert status == 200 and out["choices"][0]["text"].strip().startswith("905361"), out
    status, out = post(
        server.url + "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": DOC + "what is the code of amber?"}],
            "max_tokens": 8,
            "temperature": 0,
        },
    )
    assert status == 200 and out["choices"][0]["message"]["content"].startswith("418207"), out


def test_held_out_retrieval(server, tmp_path):
    out = tmp_path / "eval.json"
    argv = ["--url", server.url, "--lengths", "512,2048", "--per-cell", "1", "--json", str(out)]
    assert retrieval_eval.main(argv) == 0
    rep = json.loads(out.read_text())
    assert rep["overall"] >= 0.9, rep["accuracy"]


def test_long_document_asked_twice_second_from_a_replay(server):
    """A 16K document asked about two of its facts: the second ask hits the cached document; where
    SGLang already freed its SWA outside the last window, it resumes (replay on) by bounded replay
    of one window (docs/design.md 2.8); both answers are right, replay on and off."""
    import random

    from tokenizers import Tokenizer

    from sglang_dsv41.training.filler import HELD_OUT_SOURCE, filler_lines
    from sglang_dsv41.training.task import make_document, question_line

    tok = Tokenizer.from_file(str(RETRIEVAL_DIR / "tokenizer.json"))
    count = lambda text: len(tok.encode(text, add_special_tokens=False).ids)  # noqa: E731
    doc = make_document(random.Random("twice"), filler_lines(HELD_OUT_SOURCE), 16384, count, 4)
    body = "\n".join(doc.lines) + "\n"
    cached = []
    for name, code in doc.facts[:2]:
        before = server.log().count("dsv41 prefix replay")
        status, out = post(
            server.url + "/generate",
            {
                "text": body + question_line(name) + "\n",
                "sampling_params": {"max_new_tokens": 8, "temperature": 0},
            },
            timeout=600,
        )
        assert status == 200 and code in out["text"], (name, code, out)
        cached.append(
            (out["meta_info"]["cached_tokens"], server.log().count("dsv41 prefix replay") - before)
        )
    assert cached[0][0] < 100
    if "no-replay" not in server.log_path:  # replay off: exact hits only (chunk boundaries)
        # A hit over the whole document: SWA-evicted (one replay) when SGLang's lazy SWA freeing
        # (SGLANG_SWA_EVICTION_INTERVAL) already released the window at the decoder floor, exact
        # when that window is still resident; either way no prefix is prefilled again.
        assert cached[1][0] > 16000 and cached[1][1] in (0, 1), cached
