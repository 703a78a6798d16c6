"""Train the retrieval model: the curriculum, AdamW, periodic state and checkpoint.

    python -m sglang_dsv41.training.train --out DIR [--preset retrieval] [--seed 0]
        [--device cpu|cuda] [--batch 8] [--scale 1.0] [--state FILE] [--log FILE]

Per step: `batch` sequences of the current stage (`training.curriculum`); per sequence the
training forward (`training.forward`), the language-model loss (cross-entropy of the answer
digits and closing eos, averaged over the step's targets), the indexer's distillation loss
(`training.distill`, averaged over sequences) and, in supervised stages, the attention
supervision of the decoder's Full layer (`training.supervision`, averaged over the step's digit
targets, times the stage's weight); gradients summed over the batch, clipped to norm 1, AdamW
(betas 0.9 / 0.95, no weight decay). Learning rate: linear warm-up over WARMUP steps,
constant, then cosine to 10 % over the last 30 % of the curriculum's steps, and 10 % through the
polish stage that may follow it (--polish: appending it leaves every earlier step as it was).

Every --save-every steps the run state (model, optimizer, step) goes to --state atomically and
the checkpoint to --out; a run started with an existing --state resumes from it and, the data
of each step being a function of (seed, step), continues exactly as the uninterrupted run would
(CPU with --threads 1; the same machine type). On CUDA torch's deterministic algorithms are
requested (warn-only: an op without one still runs). Every --probe-every steps a held-out probe
(training.probe) is logged; every --eval-every steps the checkpoint is also written to
--snapshots/step-NNNNN (when given) and asked retrieval_eval's questions in process
(training.model_eval, --eval-spec, seed --eval-seed: keep it apart from the seed the reported
figures use). --time-limit stops at the first step boundary past that many seconds, saving
state and checkpoint. The log is one JSON object per line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from sglang_dsv41.config import preset
from sglang_dsv41.tools.tokenizer import train_tokenizer
from sglang_dsv41.training.curriculum import (
    CURRICULUM,
    POLISH_STEPS,
    POLISH_SUPERVISE,
    polish_stage,
    scaled,
    stage_at,
    step_samples,
    total_steps,
)
from sglang_dsv41.training.distill import indexer_loss, per_layer_kl
from sglang_dsv41.training.examples import TaskTokenizer
from sglang_dsv41.training.export import export_checkpoint
from sglang_dsv41.training.filler import TRAIN_SOURCE, filler_lines
from sglang_dsv41.training.forward import train_forward
from sglang_dsv41.training.init import count_parameters, initial_model, trainable_parameters
from sglang_dsv41.training.model_eval import eval_args, evaluate_model
from sglang_dsv41.training.probe import probe_accuracy, probe_set
from sglang_dsv41.training.supervision import supervision_loss
from sglang_dsv41.training.task import CODE_DIGITS

WARMUP = 100
PEAK_LR = 2e-3
DECAY_FROM = 0.7


def learning_rate(step: int, total: int, peak: float) -> float:
    if step < WARMUP:
        return peak * (step + 1) / WARMUP
    start = int(total * DECAY_FROM)
    if step < start:
        return peak
    t = min(1.0, (step - start) / max(1, total - start))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def run_step(model, samples: list, device, supervise: float = 0.0) -> dict:
    """Forward and backward of one batch (gradients accumulate); returns the step's figures.
    supervise: weight of the attention supervision (dense decoder: over every entry; sparse:
    over the selected ones, a digit whose source was not selected adding a constant)."""
    n_targets = sum(len(s.example.targets) for s in samples)
    n_digits = sum(sum(src >= 0 for src in s.example.sources) for s in samples)
    layer = model.cfg.decoder_start  # the decoder's Full layer: its entries are positions
    lm_sum, kl_sum, sup_sum, mass_sum, hits, first, exact = 0.0, 0.0, 0.0, 0.0, 0, 0, 0
    kl_layers: dict = {}
    for s in samples:
        ex = s.example
        ids = torch.tensor(ex.ids, dtype=torch.int64, device=device)
        rows = torch.tensor(ex.rows, dtype=torch.int64, device=device)
        want = torch.tensor(ex.targets, dtype=torch.int64, device=device)
        sup_on = supervise > 0
        keep = frozenset({layer}) if sup_on else frozenset()
        logits, st = train_forward(model, ids, rows, s.floor, s.modes, keep)
        lm = F.cross_entropy(logits, want, reduction="sum")
        kl = indexer_loss(st.groups)
        loss = lm / n_targets + kl / len(samples)
        if sup_on:
            digit = [i for i, src in enumerate(ex.sources) if src >= 0]
            sup_rows = torch.tensor([ex.rows[i] - s.floor for i in digit], device=device)
            sources = torch.tensor([ex.sources[i] for i in digit], device=device)
            sup, mass = supervision_loss(st.kept[layer], sup_rows, sources)
            loss = loss + supervise * sup / n_digits
            sup_sum += float(sup.detach())
            mass_sum += mass
        loss.backward()
        lm_sum += float(lm.detach())
        kl_sum += float(kl.detach())
        right = (logits.argmax(-1) == want).cpu()
        hits += int(right.sum())
        first += int(right[0])
        exact += int(right[:CODE_DIGITS].all())
        for i, v in per_layer_kl(st.groups).items():
            kl_layers[i] = kl_layers.get(i, 0.0) + v / len(samples)
    return {
        "lm": lm_sum / n_targets,
        "kl": kl_sum / len(samples),
        "acc": hits / n_targets,
        "first": first / len(samples),
        "exact": exact / len(samples),
        "sup": sup_sum / max(1, n_digits),
        "mass": mass_sum / len(samples),
        "kl_layers": {str(k): round(v, 4) for k, v in sorted(kl_layers.items())},
        "tokens": sum(len(s.example.ids) for s in samples),
    }


def save_state(path: Path, model, opt, step: int) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def parse_eval_spec(spec: str) -> list:
    """ "1024:20,16384:4" -> [(1024, 20), (16384, 4)]: prompt tokens and questions per depth."""
    out = []
    for part in spec.split(","):
        n, _, k = part.partition(":")
        try:
            out.append((int(n), int(k or 4)))
        except ValueError:
            raise ValueError(f"--eval-spec: {part!r} is not LENGTH:PER_DEPTH") from None
        if out[-1][0] < 64 or out[-1][1] < 1:
            raise ValueError(f"--eval-spec: {part!r}: length >= 64 and per depth >= 1")
    return out


def run_eval(model, tt: TaskTokenizer, spec: list, seed: int, device) -> dict:
    """The in-process retrieval check -> {"LENGTH": {"DEPTH": acc, ..., "all": acc}, "min": the
    worst cell, "nll": the codes' mean negative log-likelihood}."""
    table: dict = {}
    nll = []
    for n, k in spec:
        rep = evaluate_model(model, tt, eval_args(lengths=[n], per_cell=k, seed=seed), device)
        table.update(rep["accuracy"])
        nll += [r["nll"] for r in rep["records"]]
    worst = min(v for row in table.values() for d, v in row.items() if d != "all")
    return {**table, "min": worst, "nll": round(sum(nll) / len(nll), 5)}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m sglang_dsv41.training.train", description=__doc__)
    p.add_argument("--out", required=True, help="checkpoint directory written at every save")
    p.add_argument("--preset", default="retrieval")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=PEAK_LR)
    p.add_argument("--scale", type=float, default=1.0, help="multiply every stage's steps")
    p.add_argument("--state", help="run state file (resumed from when it exists)")
    p.add_argument("--log", help="JSON-lines log file (default: stdout)")
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--probe-every", type=int, default=100)
    p.add_argument("--stop-after", type=int, help="stop after this step (resume later)")
    p.add_argument(
        "--polish-supervise",
        type=float,
        default=POLISH_SUPERVISE,
        help=f"weight of the attention supervision over the decoder's top-k in the polish stage "
        f"(default {POLISH_SUPERVISE})",
    )
    p.add_argument("--time-limit", type=float, help="stop at the first step past this many seconds")
    p.add_argument("--eval-every", type=int, default=0, help="in-process retrieval check (0: off)")
    p.add_argument(
        "--eval-spec",
        default="1024:20,4096:20,16384:4",
        help="LENGTH:QUESTIONS_PER_DEPTH,... of the in-process check",
    )
    p.add_argument("--eval-seed", type=int, default=1, help="question seed of the in-process check")
    p.add_argument("--snapshots", help="directory for a checkpoint per in-process check")
    p.add_argument(
        "--polish",
        type=int,
        default=POLISH_STEPS,
        help=f"steps of the polish stage after the curriculum, at the final learning rate "
        f"(default {POLISH_STEPS})",
    )
    args = p.parse_args(argv)
    try:
        args.eval_spec = parse_eval_spec(args.eval_spec)
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv=None) -> int:
    argv_list = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv_list)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if device.type == "cuda":  # deterministic kernels where torch has them (cuBLAS needs this)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    cfg = preset(args.preset)
    base = scaled(CURRICULUM, args.scale)
    polish = scaled(polish_stage(args.polish, args.polish_supervise), args.scale)
    curriculum = base + polish if args.polish else base
    total, decay_total = total_steps(curriculum), total_steps(base)
    tt = TaskTokenizer(train_tokenizer(cfg.vocab_size))
    filler = filler_lines(TRAIN_SOURCE)
    model = initial_model(cfg, args.seed, device)
    opt = torch.optim.AdamW(
        trainable_parameters(model), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0
    )
    step = 0
    state = Path(args.state) if args.state else None
    if state is not None and state.exists():
        saved = torch.load(state, map_location=device)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        step = saved["step"]
    log = open(args.log, "a") if args.log else sys.stdout
    probes = probe_set(tt, (512, 2048), 8, 4)
    info = {
        "preset": args.preset,
        "seed": args.seed,
        "batch": args.batch,
        "peak_lr": args.lr,
        "stages": [s.__dict__ | {"modes": s.modes.__dict__} for s in curriculum],
        "parameters": count_parameters(model),
        "device": str(device),
        "threads": args.threads,
        "torch": torch.__version__,
        "command": shlex.join(["python", "-m", "sglang_dsv41.training.train", *argv_list]),
    }
    print(json.dumps({"start": step, "total": total, **info}), file=log, flush=True)
    t_run = time.time()

    def out_of_time() -> bool:
        return args.time_limit is not None and time.time() - t_run >= args.time_limit

    while step < total and (args.stop_after is None or step < args.stop_after):
        stage = stage_at(curriculum, step)
        lr = learning_rate(step, decay_total, args.lr)
        for g in opt.param_groups:
            g["lr"] = lr
        samples = step_samples(args.seed, step, stage, args.batch, tt, filler, cfg.sliding_window)
        t0 = time.time()
        opt.zero_grad(set_to_none=True)
        figs = run_step(model, samples, device, stage.supervise)
        gnorm = float(torch.nn.utils.clip_grad_norm_(trainable_parameters(model), 1.0))
        opt.step()
        step += 1
        rec = {"step": step, "stage": stage.name, "lr": round(lr, 6), "gnorm": round(gnorm, 3)}
        rec.update({k: round(v, 4) if isinstance(v, float) else v for k, v in figs.items()})
        rec["s"] = round(time.time() - t0, 2)
        if step % args.probe_every == 0 or step == total:
            model.eval()
            rec["probe"] = probe_accuracy(model, tt, probes, device)
            model.train()
        if args.eval_every and step % args.eval_every == 0:
            t_eval = time.time()
            rec["eval"] = run_eval(model, tt, args.eval_spec, args.eval_seed, device)
            rec["eval_s"] = round(time.time() - t_eval, 1)
            if args.snapshots:
                snap = dict(info, steps_done=step, steps_total=total)
                export_checkpoint(
                    model, args.preset, Path(args.snapshots) / f"step-{step:05d}", snap
                )
        print(json.dumps(rec), file=log, flush=True)
        stop = out_of_time()
        if step % args.save_every == 0 or step == total or stop:
            if state is not None:
                save_state(state, model, opt, step)
            info.update(steps_done=step, steps_total=total, train_s=round(time.time() - t_run))
            export_checkpoint(model, args.preset, args.out, info)
        if stop:
            print(
                json.dumps({"stopped": step, "time_limit": args.time_limit}), file=log, flush=True
            )
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
