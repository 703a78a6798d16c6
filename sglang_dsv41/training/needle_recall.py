"""Did the sparse path hold the needle? The oracle's selections at the row that writes the answer.

    python -m sglang_dsv41.training.needle_recall --model DIR [--lengths 1024,4096,16384]
        [--per-length 8] [--facts 4] [--json OUT]

For held-out documents (the evaluation filler and names, depths spread over 0..1, raw form), one
oracle forward (`reference`, full forward) per document keeps its SharedState. At the last
prompt row (the one whose logits give the first digit) it reports, per document and averaged
per length:
    pool       the fact's first digit entry is in the candidate pool (decoder ratio-1 entries are
               token positions)
    topk[L]    the entry is in the top-k of index source L (decoder Full and Reindex layers)
    first      the oracle's greedy first digit is right
tools.recall_report measures the same shortcuts against the model's own dense attention on any
text; this report asks the question that matters for retrieval.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch

from sglang_dsv41.reference.attention import SharedState
from sglang_dsv41.tools.cli import cli_parser
from sglang_dsv41.training.examples import TaskTokenizer, encode_example
from sglang_dsv41.training.filler import HELD_OUT_SOURCE, filler_lines
from sglang_dsv41.training.task import make_document


def needle_rows(model, tt: TaskTokenizer, length: int, per_length: int, facts: int, seed: int):
    cfg = model.cfg
    sources = [i for i in cfg.index_source_layer_ids if cfg.is_decoder(i)]
    rng = random.Random(f"needle:{seed}:{length}")
    out = []
    for k in range(per_length):
        depth = k / max(1, per_length - 1)
        filler = filler_lines(HELD_OUT_SOURCE)
        doc = make_document(rng, filler, length, tt.count, facts, depth, split="eval")
        ex = encode_example(tt, doc, "raw")
        ids = torch.tensor(ex.ids[: ex.prompt_len], dtype=torch.int64)
        state = SharedState()
        with torch.no_grad():
            logits = model(ids, shared=state)
        row, entry = ex.prompt_len - 1, ex.sources[0]
        rec = {
            "length": length,
            "depth": depth,
            "prompt_tokens": ex.prompt_len,
            "pool": bool(state.pool_mask[row, entry]),
            "first": int(logits[row].argmax()) == ex.targets[0],
        }
        for i in sources:
            rec[f"topk[{i}]"] = bool((state.topk[i][row] == entry).any())
        out.append(rec)
    return out


def summarize(records: list) -> dict:
    keys = [k for k in records[0] if k == "pool" or k == "first" or k.startswith("topk")]
    table = {}
    for n in sorted({r["length"] for r in records}):
        rows = [r for r in records if r["length"] == n]
        table[str(n)] = {k: sum(r[k] for r in rows) / len(rows) for k in keys}
    return table


def needle_report(model_dir, lengths, per_length: int = 8, facts: int = 4, seed: int = 0) -> dict:
    """-> {"table": length -> {pool, first, topk[L]: share of documents}, "records": [...]}."""
    from tokenizers import Tokenizer

    from sglang_dsv41.reference import load_reference

    model = load_reference(str(model_dir))
    tt = TaskTokenizer(Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json")))
    records = []
    for n in lengths:
        records += needle_rows(model, tt, n, per_length, facts, seed)
    return {"table": summarize(records), "records": records}


def parse_lengths(text: str, per_length: int) -> list:
    """ "1024,4096" -> [1024, 4096]; SystemExit naming the flag when they cannot be asked."""
    try:
        lengths = [int(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(f"needle lengths: {text!r} is not a comma-separated list") from None
    if min(lengths) < 64 or per_length < 1:
        raise SystemExit("needle lengths must be >= 64 and --per-length >= 1")
    return lengths


def format_table(table: dict) -> str:
    keys = list(next(iter(table.values())))
    lines = ["length " + " ".join(f"{k:>9}" for k in keys)]
    for n, row in table.items():
        lines.append(f"{n:>6} " + " ".join(f"{row[k]:>9.0%}" for k in keys))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = cli_parser("sglang_dsv41.training.needle_recall", __doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--lengths", default="1024,4096,16384")
    p.add_argument("--per-length", type=int, default=8)
    p.add_argument("--facts", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write records and table here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    lengths = parse_lengths(args.lengths, args.per_length)
    rep = needle_report(args.model, lengths, args.per_length, args.facts, args.seed)
    print(format_table(rep["table"]))
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
