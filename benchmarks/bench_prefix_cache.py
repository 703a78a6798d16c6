"""The prefix cache with two lifetimes (docs/design.md 2.8) against servers this script starts.

    python benchmarks/bench_prefix_cache.py [--model-path DIR] [--lengths 1024,4096,16384]
        [--docs 2 --sessions-per-doc 6 --turns 3 --session-len 4096 --message-len 1024]
        [--parts bytes,ttft,hits]
        [--peer] [--server-flags "FLAGS"] [--out DIR] [--label TEXT]

bytes   cached prefix tokens per GiB of cache from the byte calculator
        (`tools.kv_capacity.cached_prefix_bytes`): this package keeps a prefix hit-able on its
        global KV alone; SGLang's V4 layout (V4's 584 B record) also needs the prefix's
        trailing SWA window, since there a match stops where that window is gone. For the
        served model and V4.1-Flash, at every --lengths.
ttft    per length: a miss (a new document and question), a full hit (the same prompt again at
        once) and an SWA-evicted hit (the document with another question, after --push other
        documents prefilled together pushed its SWA out of the SWA room). Client-side time to
        the first streamed token of a greedy /generate (8 tokens: the reply is checked for the
        fact's code), on a server with a small SWA room (`--swa-full-tokens-ratio 0.02`) and a
        global room that holds every document.
hits    multi-turn sessions sharing long prefixes: --docs documents of --session-len tokens,
        each shared by --sessions-per-doc sessions; a turn's prompt is the session's previous
        prompt, its reply, a --message-len excerpt and a new question; a document's sessions
        take their --turns turns round-robin. A global room of half the working set, the SWA
        room of --swa-full-tokens-ratio 0.02. Hit rate = cached prompt tokens / prompt tokens
        over every ask but each document's first.
--peer runs ttft and hits again with prefix replay off (SGLANG_DSV41_PREFIX_REPLAY=off: SWA
bounds a match, as in stock SGLang). --server-flags are added to every server (the GPU machine's,
scripts/gpu_e2e/prefix_cache_on_device.sh). Writes prefix_cache.json and prefix_cache.md into
--out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPLAY_LINE = "dsv41 prefix replay: a hit of"
MODEL = Path(__file__).resolve().parent.parent / "sglang_dsv41" / "data" / "retrieval"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m sglang_dsv41.tools.serve` on loopback, its own process group, a log file."""

    def __init__(self, model: str, args: list, log: Path, env: dict | None = None):
        self.port, self.log_path = free_port(), log
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "sglang_dsv41.tools.serve", "--model-path", model]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), *args]
        self._log = open(log, "w")
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        deadline = time.time() + 600
        while "fired up" not in self.log():
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"server did not start:\n{self.log()[-3000:]}")
            time.sleep(1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def replays(self) -> int:
        return self.log().count(REPLAY_LINE)

    def first_token(self, ids: list, new: int = 8) -> tuple:
        """-> (seconds to the first streamed token, meta_info, output ids) of a greedy streamed
        /generate: TTFT and the reply from one request."""
        body = {
            "input_ids": ids,
            "stream": True,
            "sampling_params": {"max_new_tokens": new, "temperature": 0},
        }
        req = urllib.request.Request(
            self.url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        t, first, last = time.perf_counter(), None, None
        with urllib.request.urlopen(req, timeout=3600) as r:
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                last = json.loads(line[5:])
                if first is None:
                    first = time.perf_counter() - t
        return first, last["meta_info"], last["output_ids"]

    def generate(self, ids: list, new: int = 1) -> tuple:
        """-> (seconds, meta_info, output ids) of a greedy /generate."""
        body = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": new, "temperature": 0},
        }
        req = urllib.request.Request(
            self.url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        t = time.perf_counter()
        with urllib.request.urlopen(req, timeout=3600) as r:
            out = json.loads(r.read())
        return time.perf_counter() - t, out["meta_info"], out["output_ids"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=60)
        self._log.close()


class Documents:
    """Retrieval-task documents (training.task.make_document) as token ids of the model."""

    def __init__(self, model: str):
        from tokenizers import Tokenizer

        from sglang_dsv41.training.filler import HELD_OUT_SOURCE, filler_lines

        self.tok = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
        self.filler = filler_lines(HELD_OUT_SOURCE)

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def encode(self, text: str) -> list:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list) -> str:
        return self.tok.decode(ids)

    def make(self, seed: str, n: int):
        from sglang_dsv41.training.task import make_document

        return make_document(random.Random(seed), self.filler, n, self.count, 4, split="eval")

    def prompt(self, doc, fact: int) -> tuple:
        """(ids of the document and the question about fact `fact`, its code)."""
        from sglang_dsv41.training.task import question_line

        name, code = doc.facts[fact]
        return self.encode("\n".join(doc.lines) + "\n" + question_line(name) + "\n"), code


def ttft_part(server: Server, docs: Documents, lengths: list, push: int) -> list:
    rows = []
    for n in lengths:
        doc = docs.make(f"ttft:{n}", n)
        cells = {}
        for kind, fact, before in (
            ("miss", 0, None),
            ("full hit", 0, None),
            ("swa-evicted hit", 1, push),
        ):
            if before:  # other documents, prefilled together, push this one's SWA out
                others = [
                    docs.prompt(docs.make(f"push:{n}:{k}", 4096), 0)[0] for k in range(before)
                ]
                with ThreadPoolExecutor(before) as ex:
                    list(ex.map(server.generate, others))
            ids, code = docs.prompt(doc, fact)
            seen = server.replays()
            seconds, meta, out = server.first_token(ids)
            cells[kind] = {
                "seconds": round(seconds, 3),
                "prompt_tokens": meta["prompt_tokens"],
                "cached_tokens": meta["cached_tokens"],
                "replayed": server.replays() > seen,
                "answer_ok": code in docs.decode(out),
            }
            print(f"[ttft] {n} {kind}: {cells[kind]}", file=sys.stderr, flush=True)
        rows.append({"length": n, **cells})
    return rows


def hits_part(server: Server, docs: Documents, args) -> dict:
    """Groups of --sessions-per-doc sessions share one document of --session-len tokens; a turn
    adds a --message-len excerpt of other text and a question; each group's sessions take their
    --turns turns round-robin, one group after the other. Every ask but a document's first
    counts."""
    from sglang_dsv41.training.task import question_line

    prompt_total = cached_total = replayed = 0
    first_seconds, later_seconds = [], []
    for g in range(args.docs):
        doc = docs.make(f"shared:{g}", args.session_len)
        head = docs.encode("\n".join(doc.lines) + "\n")
        history = [list(head) for _ in range(args.sessions_per_doc)]
        for t in range(args.turns):
            for s in range(args.sessions_per_doc):
                name, _ = doc.facts[(s + t) % len(doc.facts)]
                note = docs.make(f"note:{g}:{s}:{t}", args.message_len) if t else None
                text = ("\n".join(note.lines) + "\n") if note else ""
                ids = history[s] + docs.encode(text + question_line(name) + "\n")
                seen = server.replays()
                seconds, meta, out = server.generate(ids, 8)
                history[s] = ids + out
                if t == 0 and s == 0:
                    first_seconds.append(seconds)
                    continue
                prompt_total += meta["prompt_tokens"]
                cached_total += meta["cached_tokens"]
                replayed += server.replays() > seen
                later_seconds.append(seconds)
        print(f"[hits] document {g}: {cached_total} / {prompt_total}", file=sys.stderr)
    return {
        "docs": args.docs,
        "sessions_per_doc": args.sessions_per_doc,
        "turns": args.turns,
        "session_len": args.session_len,
        "message_len": args.message_len,
        "asks": len(later_seconds),
        "replayed_asks": replayed,
        "hit_rate": cached_total / prompt_total if prompt_total else None,
        "cached_tokens": cached_total,
        "prompt_tokens": prompt_total,
        "first_ask_seconds_mean": sum(first_seconds) / len(first_seconds),
        "later_ask_seconds_mean": sum(later_seconds) / len(later_seconds),
    }


def bytes_part(model: str, lengths: list) -> dict:
    from sglang_dsv41.config import DeepseekV41Config, preset
    from sglang_dsv41.tools.kv_capacity import cached_prefix_bytes

    out = {}
    for name, cfg in (("served", DeepseekV41Config.from_hf(model)), ("flash", preset("flash"))):
        out[name] = {str(n): cached_prefix_bytes(cfg, n) for n in lengths}
    return out


def rooms(log: str) -> str:
    line = next((x for x in log.splitlines() if "dsv41 pool sizing" in x), "")
    return line.split("dsv41 pool sizing: ", 1)[-1]


def run(args, out: Path, env: dict, tag: str) -> dict:
    docs, res = Documents(args.model_path), {}
    extra = args.server_flags.split()
    if "ttft" in args.parts:
        flags = ["--swa-full-tokens-ratio", "0.02", "--chunked-prefill-size", "4096", *extra]
        s = Server(args.model_path, flags, out / f"ttft_{tag}.log", env)
        try:
            res["ttft"] = ttft_part(s, docs, args.lengths, args.push)
            res["ttft_rooms"] = rooms(s.log())
        finally:
            s.stop()
    if "hits" in args.parts:
        per_doc = args.session_len + args.sessions_per_doc * args.turns * (args.message_len + 20)
        working = args.docs * per_doc
        room = max(working // 2 // 2 * 2, per_doc // 2 * 2 + 4096)
        flags = ["--max-total-tokens", str(room), "--swa-full-tokens-ratio", "0.02", *extra]
        s = Server(args.model_path, flags, out / f"hits_{tag}.log", env)
        try:
            res["hits"] = hits_part(s, docs, args)
            res["hits"]["global_room"], res["hits"]["working_set"] = room, working
            res["hits_rooms"] = rooms(s.log())
        finally:
            s.stop()
    return res


def cell(v: dict) -> str:
    how = ", replay" if v["replayed"] else ""
    ok = "" if v["answer_ok"] else ", WRONG answer"
    return f"{v['seconds']} s ({v['cached_tokens']} cached{how}{ok})"


def markdown(rep: dict) -> str:
    lines = [f"# Prefix cache ({rep.get('label') or 'unlabelled'}, commit {rep['commit']})", ""]
    if "bytes" in rep:
        lines += ["| model | prefix | dsv41 B/token | V4 layout B/token | tokens/GiB x |"]
        lines += ["|---|---|---|---|---|"]
        for model, by_len in rep["bytes"].items():
            for n, r in by_len.items():
                x = r["dsv41"]["tokens_per_gib"] / r["v4"]["tokens_per_gib"]
                lines.append(
                    f"| {model} | {n} | {r['dsv41']['bytes_per_token']:.1f} | "
                    f"{r['v4']['bytes_per_token']:.1f} | {x:.2f} |"
                )
        lines.append("")
    for tag in ("on", "off"):
        part = rep.get(tag)
        if not part:
            continue
        for row in part.get("ttft", []):
            cells = [f"{k}: {cell(v)}" for k, v in row.items() if k != "length"]
            lines.append(f"- prefix replay {tag}, {row['length']} tokens: " + "; ".join(cells))
        if "hits" in part:
            h = part["hits"]
            lines.append(
                f"- prefix replay {tag}, hits: {h['hit_rate']:.3f} ({h['cached_tokens']} / "
                f"{h['prompt_tokens']}, {h['replayed_asks']} of {h['asks']} asks replayed), a "
                f"document's first ask {h['first_ask_seconds_mean']:.2f} s, the others "
                f"{h['later_ask_seconds_mean']:.2f} s (global room {h['global_room']} of a "
                f"{h['working_set']}-token working set)"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", default=str(MODEL))
    p.add_argument("--lengths", default="1024,4096,16384")
    p.add_argument("--parts", default="bytes,ttft,hits")
    p.add_argument("--push", type=int, default=4, help="4K documents between the two asks")
    p.add_argument("--docs", type=int, default=2)
    p.add_argument("--sessions-per-doc", type=int, default=6)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--session-len", type=int, default=4096)
    p.add_argument("--message-len", type=int, default=1024)
    p.add_argument("--peer", action="store_true", help="also run with prefix replay off")
    p.add_argument("--server-flags", default="", help="added to every server's flags")
    p.add_argument("--out", default="prefix_cache_out")
    p.add_argument("--label", default="")
    args = p.parse_args(argv)
    args.lengths = [int(x) for x in args.lengths.split(",")]
    args.parts = set(args.parts.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    rep = {"label": args.label, "commit": commit, "command": sys.argv}
    if "bytes" in args.parts:
        rep["bytes"] = bytes_part(args.model_path, args.lengths)
    rep["on"] = run(args, out, {"SGLANG_DSV41_PREFIX_REPLAY": "on"}, "on")
    if args.peer:
        rep["off"] = run(args, out, {"SGLANG_DSV41_PREFIX_REPLAY": "off"}, "off")
    (out / "prefix_cache.json").write_text(json.dumps(rep, indent=1))
    (out / "prefix_cache.md").write_text(markdown(rep))
    print(markdown(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
