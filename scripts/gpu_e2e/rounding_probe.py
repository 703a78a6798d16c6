"""How fp32 rounding moves the tiny model's answers (CPU; docs/gpu_e2e.md, "Rounding").

    .venv/bin/python scripts/gpu_e2e/rounding_probe.py count REFERENCE_JSON
    .venv/bin/python scripts/gpu_e2e/rounding_probe.py perturb CKPT REFERENCE_JSON [--noise 1e-7]
        [--seed 0] [--lengths 41,97,150,201]
    .venv/bin/python scripts/gpu_e2e/rounding_probe.py trace CKPT REFERENCE_JSON [--length 16]

count    prompts whose fp32 and fp64 oracle answers (reference.py) part before the end: a token
         or a logprob beyond the client's LOGPROB_TOL (verdicts.horizon), and the worst logprob
         gap at steps before their tokens differ.
perturb  the fp32 oracle with its embedding table scaled by (1 + noise x N(0, 1)), teacher-forced
         on the reference's replay-mode tokens: the worst logprob change per prompt and the first
         step whose greedy token changes (with the unperturbed margin there).
trace    one prompt plus its answer as one sequence, fp32 against fp64: the first quantization
         call (layers.quant) whose record values differ, with the values either side.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from verdicts import LOGPROB_TOL, horizon  # noqa: E402


def count(ref: dict) -> None:
    for mode in ("replay", "full"):
        parted, worst = 0, 0.0
        for a, b in zip(ref[mode], ref[mode + "64"], strict=True):
            parted += horizon(a, [b]) < len(a)
            same = [(x, y) for x, y in zip(a, b, strict=True)]
            cut = next((k for k, (x, y) in enumerate(same) if x["token"] != y["token"]), len(a))
            worst = max([worst] + [abs(x["logprob"] - y["logprob"]) for x, y in same[:cut]])
        print(f"{mode}: {parted} / {len(ref[mode])} prompts part (tol {LOGPROB_TOL}); worst "
              f"logprob gap before a token differs {worst:.3g}")  # fmt: skip


@torch.no_grad()
def perturb(ckpt: str, ref: dict, noise: float, seed: int, lengths: list[int]) -> None:
    from sglang_dsv41.reference import load_reference

    model = load_reference(ckpt)
    g = torch.Generator().manual_seed(seed)
    w = model.embed.weight
    w.mul_(1 + noise * torch.randn(w.shape, generator=g))
    for prompt, steps in zip(ref["prompts"], ref["replay"], strict=True):
        if len(prompt) not in lengths:
            continue
        ids, worst, first = list(prompt), 0.0, None
        floor = model.replay_floor_for(len(prompt), True)
        for k, s in enumerate(steps):
            logits = model(torch.tensor(ids), replay_floor=floor)[-1].double()
            worst = max(worst, abs(float(torch.log_softmax(logits, -1)[s["token"]]) - s["logprob"]))
            if first is None and int(logits.argmax()) != s["token"]:
                first = (k, round(s["margin"], 4))
            ids.append(s["token"])
        print(f"len {len(prompt):4d}: worst logprob change {worst:.3g}, first token change {first}")


@torch.no_grad()
def trace(ckpt: str, ref: dict, length: int) -> None:
    import sglang_dsv41.layers.quant as quant
    from sglang_dsv41.reference import load_reference

    i = [len(p) for p in ref["prompts"]].index(length)
    ids = torch.tensor(ref["prompts"][i] + [s["token"] for s in ref["full"][i]])
    original, runs = quant.fake_quant, []
    for dtype in (torch.float32, torch.float64):
        calls = []

        def recording(layout, x, calls=calls):
            y = original(layout, x)
            calls.append((layout, x.double(), y.double()))
            return y

        quant.fake_quant = recording
        try:
            load_reference(ckpt, dtype)(ids)
        finally:
            quant.fake_quant = original
        runs.append(calls)
    for k, ((layout, x32, y32), (_, x64, y64)) in enumerate(zip(*runs, strict=True)):
        diff = (y32 != y64).nonzero()
        if len(diff):
            at = tuple(diff[0].tolist())
            print(f"first differing quantization: call {k} ({layout.name}, {len(diff)} values), "
                  f"at {at}: fp32 input {x32[at]:.9g} -> {y32[at]:.6g}, fp64 input "
                  f"{x64[at]:.12g} -> {y64[at]:.6g}")  # fmt: skip
            return
    print("no quantized value differs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["count", "perturb", "trace"])
    ap.add_argument("paths", nargs="+", help="[CKPT] REFERENCE_JSON")
    ap.add_argument("--noise", type=float, default=1e-7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lengths", default="41,97,150,201")
    ap.add_argument("--length", type=int, default=16)
    a = ap.parse_args()
    torch.set_num_threads(1)
    with open(a.paths[-1]) as f:
        ref = json.load(f)
    if a.what == "count":
        count(ref)
    elif a.what == "perturb":
        perturb(a.paths[0], ref, a.noise, a.seed, [int(n) for n in a.lengths.split(",")])
    else:
        trace(a.paths[0], ref, a.length)


if __name__ == "__main__":
    main()
