"""Time the retrieval model's training step, one process alone, per curriculum stage.

    python benchmarks/bench_train_step.py [--device cpu|cuda] [--threads 1] [--batch 8]
        [--stages recall,dense,sparse,long,polish] [--steps 3] [--seed 0] [--json OUT]

Per stage: `--steps` consecutive steps of `training.train`'s recipe from the stage's first step
(the same data, the same forward and backward, AdamW), timed one by one (CUDA synchronized),
the first counted as warm-up; and, once, the number of aten operations one sequence of that
stage dispatches in its forward and backward (a TorchDispatchMode; views included), which is
what bounds a GPU that waits on launches. Starting weights: the seeded random checkpoint
(`training.init`); the step's cost depends on the shapes, not on the weights. Prints a table
and one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class OpCount(TorchDispatchMode):
    """Counts the aten operations dispatched inside the block, by name."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def stage_starts(curriculum) -> dict:
    out, at = {}, 0
    for s in curriculum:
        out[s.name] = (at, s)
        at += s.steps
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--stages", default="recall,dense,sparse,long,polish")
    ap.add_argument("--steps", type=int, default=3, help="steps per stage, the first a warm-up")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first is a warm-up)")

    from sglang_dsv41.config import preset
    from sglang_dsv41.tools.tokenizer import train_tokenizer
    from sglang_dsv41.training.curriculum import (
        CURRICULUM,
        POLISH_STEPS,
        POLISH_SUPERVISE,
        polish_stage,
        step_samples,
    )
    from sglang_dsv41.training.examples import TaskTokenizer
    from sglang_dsv41.training.filler import TRAIN_SOURCE, filler_lines
    from sglang_dsv41.training.init import initial_model, trainable_parameters
    from sglang_dsv41.training.train import run_step

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = preset("retrieval")
    tt = TaskTokenizer(train_tokenizer(cfg.vocab_size))
    filler = filler_lines(TRAIN_SOURCE)
    starts = stage_starts(CURRICULUM + polish_stage(POLISH_STEPS, POLISH_SUPERVISE))
    names = args.stages.split(",")
    unknown = [n for n in names if n not in starts]
    if unknown:
        ap.error(f"--stages: unknown {unknown}; choose from {list(starts)}")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rows = []
    for name in names:
        first, stage = starts[name]
        model = initial_model(cfg, args.seed, device)
        opt = torch.optim.AdamW(trainable_parameters(model), lr=1e-4, betas=(0.9, 0.95))
        times, tokens = [], []
        for k in range(args.steps):
            samples = step_samples(
                args.seed, first + k, stage, args.batch, tt, filler, cfg.sliding_window
            )
            sync()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            figs = run_step(model, samples, device, stage.supervise)
            torch.nn.utils.clip_grad_norm_(trainable_parameters(model), 1.0)
            opt.step()
            sync()
            times.append(time.perf_counter() - t0)
            tokens.append(figs["tokens"])
            print(f"[{name} {k + 1}/{args.steps}] {times[-1]:.2f} s", file=sys.stderr, flush=True)
        one = step_samples(args.seed, first, stage, 1, tt, filler, cfg.sliding_window)
        with OpCount() as count:
            run_step(model, one, device, stage.supervise)
        step_s = statistics.median(times[1:])
        rows.append(
            {
                "stage": name,
                "step_s": round(step_s, 3),
                "tokens_per_step": round(statistics.mean(tokens[1:])),
                "tokens_per_s": round(statistics.mean(tokens[1:]) / step_s),
                "ops_per_sequence": sum(count.ops.values()),
                "ops_sequence_tokens": len(one[0].example.ids),
                "top_ops": dict(count.ops.most_common(6)),
            }
        )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out = {
        "device": name,
        "torch": torch.__version__,
        "threads": args.threads,
        "batch": args.batch,
        "steps": args.steps,
        "stages": rows,
    }
    print(f"{name}, torch {torch.__version__}, batch {args.batch}, threads {args.threads}")
    print("stage   | s / step | tokens / step | tokens / s | aten ops / sequence")
    for r in rows:
        print(
            f"{r['stage']:<7} | {r['step_s']:8.2f} | {r['tokens_per_step']:13d} | "
            f"{r['tokens_per_s']:10d} | {r['ops_per_sequence']} ({r['ops_sequence_tokens']} tokens)"
        )
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
