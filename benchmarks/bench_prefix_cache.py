"""The prefix cache with two lifetimes (docs/design.md 2.8) against servers this script starts.

    python benchmarks/bench_prefix_cache.py [--model-path DIR] [--lengths 1024,4096,16384]
        [--sessions 12 --wave 4 --turns 4 --session-len 2048] [--parts bytes,ttft,hits]
        [--peer] [--out DIR] [--label TEXT]

bytes   cached prefix tokens per GiB of cache from the byte calculator
        (`tools.kv_capacity.cached_prefix_bytes`): this package keeps a prefix hit-able on its
        global KV alone; SGLang's V4 layout (V4's 584 B record) also needs the prefix's
        trailing SWA window, since there a match stops where that window is gone. For the
        served model and V4.1-Flash, at every --lengths.
ttft    per length: a miss (a new document and question), a full hit (the same prompt again at
        once) and an SWA-evicted hit (the document with another question, after other
        documents pushed its SWA out of the SWA room). Client-side time of a 1-token /generate
        on a server with a small SWA room (`--swa-full-tokens-ratio 0.02`) and a global room
        that holds every document. The retrieval model's reply to each question is checked.
hits    multi-turn sessions sharing long prefixes: waves of --wave concurrent sessions, each a
        document of --session-len tokens and --turns questions (turn t's prompt is turn t-1's
        prompt, its reply and a new question), round-robin within a wave; a global room of
        half the working set, a small SWA room. Hit rate = cached prompt tokens / prompt tokens
        over turns after the first.
--peer runs ttft and hits again with prefix replay off (SGLANG_DSV41_PREFIX_REPLAY=off: SWA
bounds a match, as in stock SGLang). Writes prefix_cache.json and prefix_cache.md into --out.
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


def answered(docs: Documents, server: Server, ids: list, code: str) -> bool:
    return code in docs.decode(server.generate(ids, 8)[2])


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
            if before:
                for k in range(before):  # other documents push this one's SWA out
                    other = docs.make(f"push:{n}:{k}", 4096)
                    server.generate(docs.prompt(other, 0)[0])
            ids, code = docs.prompt(doc, fact)
            seen = server.replays()
            seconds, meta, _ = server.generate(ids)
            cells[kind] = {
                "seconds": round(seconds, 3),
                "prompt_tokens": meta["prompt_tokens"],
                "cached_tokens": meta["cached_tokens"],
                "replayed": server.replays() > seen,
                "answer_ok": answered(docs, server, ids, code),
            }
            print(f"[ttft] {n} {kind}: {cells[kind]}", file=sys.stderr, flush=True)
        rows.append({"length": n, **cells})
    return rows


def hits_part(server: Server, docs: Documents, sessions: int, wave: int, turns: int, n: int):
    from sglang_dsv41.training.task import question_line

    prompt_total = cached_total = 0
    first_seconds, later_seconds = [], []
    for w in range(0, sessions, wave):
        group = [docs.make(f"session:{s}", n) for s in range(w, min(w + wave, sessions))]
        history = [docs.encode("\n".join(d.lines) + "\n") for d in group]
        for t in range(turns):
            for s, d in enumerate(group):
                name, _ = d.facts[t % len(d.facts)]
                ids = history[s] + docs.encode(question_line(name) + "\n")
                seconds, meta, out = server.generate(ids, 8)
                history[s] = ids + out
                if t:
                    prompt_total += meta["prompt_tokens"]
                    cached_total += meta["cached_tokens"]
                    later_seconds.append(seconds)
                else:
                    first_seconds.append(seconds)
        print(f"[hits] wave {w // wave}: {cached_total} / {prompt_total}", file=sys.stderr)
    return {
        "sessions": sessions,
        "wave": wave,
        "turns": turns,
        "session_len": n,
        "hit_rate": cached_total / prompt_total if prompt_total else None,
        "cached_tokens": cached_total,
        "prompt_tokens": prompt_total,
        "first_turn_seconds_mean": sum(first_seconds) / len(first_seconds),
        "later_turn_seconds_mean": sum(later_seconds) / len(later_seconds),
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
    if "ttft" in args.parts:
        flags = ["--swa-full-tokens-ratio", "0.02", "--chunked-prefill-size", "4096"]
        s = Server(args.model_path, flags, out / f"ttft_{tag}.log", env)
        try:
            res["ttft"] = ttft_part(s, docs, args.lengths, args.push)
            res["ttft_rooms"] = rooms(s.log())
        finally:
            s.stop()
    if "hits" in args.parts:
        working = args.sessions * (args.session_len + args.turns * 40)
        room = max(working // 2 // 2 * 2, 4 * args.session_len)
        flags = ["--max-total-tokens", str(room), "--swa-full-tokens-ratio", "0.05"]
        flags += ["--chunked-prefill-size", "1024"]
        s = Server(args.model_path, flags, out / f"hits_{tag}.log", env)
        try:
            res["hits"] = hits_part(s, docs, args.sessions, args.wave, args.turns, args.session_len)
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
                f"{h['prompt_tokens']}), turn 1 {h['first_turn_seconds_mean']:.2f} s, later "
                f"{h['later_turn_seconds_mean']:.2f} s"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", default=str(MODEL))
    p.add_argument("--lengths", default="1024,4096,16384")
    p.add_argument("--parts", default="bytes,ttft,hits")
    p.add_argument("--push", type=int, default=3, help="4K documents between the two asks")
    p.add_argument("--sessions", type=int, default=12)
    p.add_argument("--wave", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--session-len", type=int, default=2048)
    p.add_argument("--peer", action="store_true", help="also run with prefix replay off")
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
