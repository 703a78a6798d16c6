"""Retrieval accuracy of any running server, by context length and needle depth.

    python -m sglang_dsv41.tools.retrieval_eval --url http://127.0.0.1:30000
        [--lengths 1024,4096,16384] [--depths 0,0.25,0.5,0.75,1] [--per-cell 4] [--facts 4]
        [--form raw|chat] [--filler docstrings|topics] [--seed 0] [--tokenizer DIR]
        [--json OUT.json] [--plot OUT.png] [--label TEXT]

The task (`sglang_dsv41.training.task`): a document of filler lines holding --facts facts
`the code of NAME is DDDDDD.`, then `what is the code of NAME?`; an answer is right when the
first six digits the model writes are the code. Raw form: `/v1/completions` with the raw
prompt; chat form: `/v1/chat/completions` with one user message. Both at temperature 0 with
max_tokens 8. Documents come from the held-out filler (the Python standard library's
docstrings) and evaluation names (never trained on) by default, seeded per (seed, length,
depth, index): the same flags ask the same questions of every server.

Lengths are prompt tokens of the served model's tokenizer (read from the model directory the
server reports at /get_model_info, or --tokenizer DIR); each record keeps the prompt_tokens the
server counted. Prints a table (accuracy per length x depth), writes the records and the
table as JSON and, with --plot, a heat map.
"""

from __future__ import annotations

import json
import random
import sys
import time
import urllib.request
from pathlib import Path

from sglang_dsv41.tools.cli import cli_parser
from sglang_dsv41.training.filler import HELD_OUT_SOURCE, SOURCES, filler_lines
from sglang_dsv41.training.task import first_code, make_document

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
MAX_TOKENS = 8


def post_json(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode())


def get_json(url: str, timeout: float = 30.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


def load_counter(tokenizer_dir: str | None, url: str):
    """str -> token count (no specials) with the served model's `tokenizer.json`."""
    from tokenizers import Tokenizer

    if tokenizer_dir is None:
        tokenizer_dir = get_json(url + "/get_model_info")["model_path"]
    tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    cache: dict = {}

    def count(text: str) -> int:
        if text not in cache:
            cache[text] = len(tok.encode(text, add_special_tokens=False).ids)
        return cache[text]

    return count


def ask(url: str, doc, form: str, timeout: float) -> tuple:
    """-> (reply text, prompt tokens the server counted)."""
    if form == "raw":
        body = {"prompt": doc.raw_prompt(), "max_tokens": MAX_TOKENS, "temperature": 0}
        out = post_json(url + "/v1/completions", body, timeout)
        text = out["choices"][0]["text"]
    else:
        body = {
            "messages": [{"role": "user", "content": doc.chat_content()}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
        }
        out = post_json(url + "/v1/chat/completions", body, timeout)
        text = out["choices"][0]["message"]["content"] or ""
    return text, out.get("usage", {}).get("prompt_tokens")


def eval_documents(args, count):
    """-> [(length, depth, index, Document)]: the questions of --lengths x --depths x
    --per-cell, each seeded by (seed, length, depth, index); count: str -> tokens."""
    filler = filler_lines(args.filler)
    split = "eval" if args.filler == HELD_OUT_SOURCE else "train"
    out = []
    for n in args.lengths:
        for d in args.depths:
            for k in range(args.per_cell):
                rng = random.Random(f"eval:{args.seed}:{n}:{d}:{k}")
                doc = make_document(rng, filler, n, count, args.facts, depth=d, split=split)
                out.append((n, d, k, doc))
    return out


def evaluate(args, count, progress=sys.stderr) -> dict:
    records = []
    cells = eval_documents(args, count)
    t_all = time.time()
    for j, (n, d, k, doc) in enumerate(cells):
        t0 = time.time()
        text, prompt_tokens = ask(args.url, doc, args.form, args.timeout)
        got = first_code(text)
        records.append(
            {
                "length": n,
                "depth": d,
                "index": k,
                "prompt_tokens": prompt_tokens,
                "name": doc.name,
                "code": doc.code,
                "reply": text,
                "answer": got,
                "ok": got == doc.code,
                "seconds": round(time.time() - t0, 3),
            }
        )
        print(
            f"[{j + 1}/{len(cells)}] length {n} depth {d:g}: "
            f"{'ok' if got == doc.code else 'WRONG'} ({time.time() - t0:.1f} s)",
            file=progress,
            flush=True,
        )
    return summarize(args, records, time.time() - t_all)


def summarize(args, records: list, seconds: float) -> dict:
    table = {}
    for n in args.lengths:
        row = {}
        for d in args.depths:
            oks = [r["ok"] for r in records if r["length"] == n and r["depth"] == d]
            row[f"{d:g}"] = sum(oks) / len(oks)
        oks = [r["ok"] for r in records if r["length"] == n]
        row["all"] = sum(oks) / len(oks)
        table[str(n)] = row
    return {
        "url": args.url,
        "label": args.label,
        "form": args.form,
        "filler": args.filler,
        "facts": args.facts,
        "per_cell": args.per_cell,
        "seed": args.seed,
        "lengths": list(args.lengths),
        "depths": list(args.depths),
        "accuracy": table,
        "overall": sum(r["ok"] for r in records) / len(records),
        "seconds": round(seconds, 1),
        "records": records,
    }


def format_table(rep: dict) -> str:
    depths = [f"{d:g}" for d in rep["depths"]]
    head = "length | " + " | ".join(f"d={d}" for d in depths) + " | all"
    lines = [head, "-" * len(head)]
    for n, row in rep["accuracy"].items():
        cells = " | ".join(f"{row[d]:.0%}".rjust(len(f"d={d}")) for d in depths)
        lines.append(f"{n:>6} | {cells} | {row['all']:.0%}")
    lines.append(f"overall {rep['overall']:.1%} ({len(rep['records'])} prompts, {rep['form']})")
    return "\n".join(lines)


def parse_args(argv):
    p = cli_parser("sglang_dsv41.tools.retrieval_eval", __doc__)
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--lengths", default="1024,4096,16384", help="prompt tokens, comma separated")
    p.add_argument("--depths", default=",".join(f"{d:g}" for d in DEPTHS))
    p.add_argument("--per-cell", type=int, default=4, help="prompts per (length, depth)")
    p.add_argument("--facts", type=int, default=4, help="facts per document")
    p.add_argument("--form", choices=("raw", "chat"), default="raw")
    p.add_argument("--filler", choices=SOURCES, default=HELD_OUT_SOURCE)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", help="directory with tokenizer.json (default: the server's)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per request")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--plot", help="write a heat map PNG here")
    p.add_argument("--label", default="", help="free text kept in the report")
    args = p.parse_args(argv)
    args.url = args.url.rstrip("/")
    args.lengths = [int(x) for x in args.lengths.split(",")]
    args.depths = [float(x) for x in args.depths.split(",")]
    for d in args.depths:
        if not 0.0 <= d <= 1.0:
            p.error(f"--depths: {d} is outside [0, 1]")
    if args.facts < 1 or args.per_cell < 1:
        p.error("--facts and --per-cell must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    rep = evaluate(args, load_counter(args.tokenizer, args.url))
    print(format_table(rep))
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=2) + "\n", encoding="utf-8")
    if args.plot:
        from sglang_dsv41.tools.retrieval_plot import plot_accuracy

        plot_accuracy(rep, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
