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
