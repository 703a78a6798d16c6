"""retrieval_eval against a stub server that reads the answer from the prompt, except for needles
at one depth: the tool must count exactly those wrong, in both forms, and draw its plot."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sglang_dsv41.tools import retrieval_eval
from sglang_dsv41.tools.tokenizer import save_tokenizer

WRONG_DEPTH = 0.5


def stub_answer(prompt: str) -> str:
    """The code of the asked name, unless its line sits in the middle of the document."""
    name = re.search(r"what is the code of ([a-z]+)\?", prompt)[1]
    lines = prompt.split("\n")
    doc = lines[: lines.index(f"what is the code of {name}?")]
    at = doc.index(next(x for x in doc if x.startswith(f"the code of {name} is")))
    code = re.search(rf"the code of {name} is (\d{{6}})\.", prompt)[1]
    if abs(at / (len(doc) - 1) - WRONG_DEPTH) < 0.2:
        return "999999"
    return f" {code}\n"


class Stub(BaseHTTPRequestHandler):
    model_path = ""

    def _send(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 (http.server's name)
        self._send({"model_path": self.model_path})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["temperature"] == 0
        if self.path == "/v1/completions":
            assert body["prompt"].endswith("?\n")
            text = stub_answer(body["prompt"])
            self._send({"choices": [{"text": text}], "usage": {"prompt_tokens": 7}})
        else:
            (msg,) = body["messages"]
            assert msg["role"] == "user" and msg["content"].endswith("?")
            text = stub_answer(msg["content"] + "\n")
            self._send({"choices": [{"message": {"content": text}}], "usage": {}})

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def stub_url(tmp_path_factory):
    tok_dir = tmp_path_factory.mktemp("tok")
    save_tokenizer(tok_dir, 512, 4096)
    Stub.model_path = str(tok_dir)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("form", ["raw", "chat"])
def test_accuracy_table_by_length_and_depth(stub_url, tmp_path, capsys, form):
    out, plot = tmp_path / "r.json", tmp_path / "r.png"
    argv = ["--url", stub_url + "/", "--lengths", "256,512", "--per-cell", "2", "--form", form]
    argv += ["--depths", "0,0.5,1", "--json", str(out), "--plot", str(plot)]
    assert retrieval_eval.main(argv) == 0
    rep = json.loads(out.read_text())
    for n in ("256", "512"):
        assert rep["accuracy"][n] == {"0": 1.0, "0.5": 0.0, "1": 1.0, "all": pytest.approx(2 / 3)}
    assert rep["overall"] == pytest.approx(2 / 3) and len(rep["records"]) == 12
    wrong = [r for r in rep["records"] if not r["ok"]]
    assert all(r["depth"] == 0.5 and r["answer"] == "999999" for r in wrong)
    assert rep["filler"] == "docstrings" and rep["form"] == form
    assert plot.stat().st_size > 1000
    table = capsys.readouterr().out
    assert "length | d=0 | d=0.5 | d=1 | all" in table and "overall 66.7%" in table


def test_same_flags_ask_the_same_questions(stub_url, tmp_path):
    reps = []
    for k in range(2):
        out = tmp_path / f"{k}.json"
        argv = ["--url", stub_url, "--lengths", "300", "--per-cell", "1", "--json", str(out)]
        assert retrieval_eval.main(argv) == 0
        reps.append(json.loads(out.read_text())["records"])
    assert [(r["name"], r["code"]) for r in reps[0]] == [(r["name"], r["code"]) for r in reps[1]]
