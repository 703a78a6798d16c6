"""Retrieval accuracy of a checkpoint without a server: retrieval_eval's questions, in process.

    python -m sglang_dsv41.training.model_eval --model DIR [--device cpu|cuda]
        [--lengths 1024,4096,16384] [--depths 0,0.25,0.5,0.75,1] [--per-cell 4] [--facts 4]
        [--filler docstrings|topics] [--seed 0] [--replay on|off] [--json OUT.json]

The documents are `tools.retrieval_eval`'s (the same flags ask the same questions, raw form),
counted with the checkpoint's own tokenizer. Each is run once through the training forward
(`training.forward`) in served attention (top-k and candidate pool, every record's
quantization) with the decoder from the serving replay floor (prompt minus the window;
`--replay off`: the full forward), its answer digits teacher-forced. An answer counts when
each of the six digits is the argmax given the ones before it, which is exactly when greedy
decoding writes the code first. On the CPU these logits are the oracle's bit for bit, so the
figures are the CPU server's; on CUDA they differ only by the device's rounding. One forward
per question instead of a prefill and seven decode steps: the quick check while training
(`train.py --eval-every`) and for choosing between checkpoints.

Prints the table of retrieval_eval and the mean negative log-likelihood of the codes (finer
than right or wrong: it separates two checkpoints that miss equally often), and writes the same
JSON (records without reply text, with each code's NLL).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from sglang_dsv41.tools.retrieval_eval import DEPTHS, eval_documents, format_table, summarize
from sglang_dsv41.training.examples import TaskTokenizer, encode_example
from sglang_dsv41.training.filler import HELD_OUT_SOURCE, SOURCES
from sglang_dsv41.training.forward import SPARSE, train_forward
from sglang_dsv41.training.task import CODE_DIGITS


def eval_args(**kw) -> argparse.Namespace:
    """retrieval_eval's question flags with their defaults, overridden by kw."""
    base = {
        "lengths": [1024, 4096, 16384],
        "depths": list(DEPTHS),
        "per_cell": 4,
        "facts": 4,
        "filler": HELD_OUT_SOURCE,
        "seed": 0,
        "replay": True,
        "url": "",
        "label": "",
        "form": "raw",
    }
    unknown = set(kw) - set(base)
    if unknown:
        raise TypeError(f"eval_args: unknown {sorted(unknown)}")
    return argparse.Namespace(**(base | kw))


@torch.no_grad()
def answer_ok(model, tt: TaskTokenizer, doc, replay: bool, device) -> tuple:
    """-> (all six digits right, the digits the model's argmax writes under teacher forcing,
    the code's negative log-likelihood: the sum over its digits of -log p(digit | the ones
    before), a finer measure than right or wrong)."""
    ex = encode_example(tt, doc, "raw")
    ids = torch.tensor(ex.ids, dtype=torch.int64, device=device)
    rows = torch.tensor(ex.rows[:CODE_DIGITS], dtype=torch.int64, device=device)
    floor = model.replay_floor_for(ex.prompt_len, replay)  # the oracle's and the server's
    logits, _ = train_forward(model, ids, rows, floor, SPARSE)
    want = torch.tensor(ex.targets[:CODE_DIGITS], dtype=torch.int64, device=device)
    nll = float(torch.nn.functional.cross_entropy(logits, want, reduction="sum"))
    got = logits.argmax(-1).tolist()
    return got == ex.targets[:CODE_DIGITS], tt.tok.decode(got), nll


def evaluate_model(model, tt: TaskTokenizer, args, device="cpu", progress=None) -> dict:
    """The questions of `args` (eval_args) asked of `model` -> retrieval_eval's report."""
    was_training = model.training
    model.eval()
    records = []
    t_all = time.time()
    cells = eval_documents(args, tt.count)
    for j, (n, d, k, doc) in enumerate(cells):
        t0 = time.time()
        ok, text, nll = answer_ok(model, tt, doc, args.replay, device)
        records.append(
            {
                "length": n,
                "depth": d,
                "index": k,
                "name": doc.name,
                "code": doc.code,
                "answer": text,
                "ok": ok,
                "nll": round(nll, 5),
                "seconds": round(time.time() - t0, 3),
            }
        )
        if progress is not None:
            print(
                f"[{j + 1}/{len(cells)}] length {n} depth {d:g}: {'ok' if ok else 'WRONG'}",
                file=progress,
                flush=True,
            )
    model.train(was_training)
    rep = summarize(args, records, time.time() - t_all)
    rep["replay"] = args.replay
    rep["mean_nll"] = sum(r["nll"] for r in records) / len(records)
    return rep


def load_task_tokenizer(model_dir) -> TaskTokenizer:
    from tokenizers import Tokenizer

    return TaskTokenizer(Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json")))


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m sglang_dsv41.training.model_eval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's)")
    p.add_argument("--lengths", default="1024,4096,16384")
    p.add_argument("--depths", default=",".join(f"{d:g}" for d in DEPTHS))
    p.add_argument("--per-cell", type=int, default=4)
    p.add_argument("--facts", type=int, default=4)
    p.add_argument("--filler", choices=SOURCES, default=HELD_OUT_SOURCE)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replay", choices=("on", "off"), default="on")
    p.add_argument("--json", help="write the report here")
    a = p.parse_args(argv)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (Path(a.model) / name).is_file():
            p.error(f"--model {a.model}: no {name} there (a checkpoint directory is needed)")
    depths = [float(x) for x in a.depths.split(",")]
    if any(not 0.0 <= d <= 1.0 for d in depths):
        p.error(f"--depths: {a.depths} has a value outside [0, 1]")
    if a.facts < 1 or a.per_cell < 1:
        p.error("--facts and --per-cell must be >= 1")
    return a, eval_args(
        lengths=[int(x) for x in a.lengths.split(",")],
        depths=depths,
        per_cell=a.per_cell,
        facts=a.facts,
        filler=a.filler,
        seed=a.seed,
        replay=a.replay == "on",
        url=f"model:{a.model}",
        label=f"in process, {a.device}",
    )


def main(argv=None) -> int:
    a, args = parse_args(sys.argv[1:] if argv is None else argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    from sglang_dsv41.reference.model import load_reference

    model = load_reference(a.model).to(a.device)
    rep = evaluate_model(model, load_task_tokenizer(a.model), args, a.device, sys.stderr)
    print(format_table(rep))
    print(f"mean code NLL {rep['mean_nll']:.4f} nats")
    if a.json:
        Path(a.json).write_text(json.dumps(rep, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
