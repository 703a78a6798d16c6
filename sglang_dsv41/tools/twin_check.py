"""The cached serving path against the oracle where rounding cannot decide: both in float64.

    python -m sglang_dsv41.tools.twin_check CHECKPOINT --answers ANSWERS.json
        [--device cuda] [--chunk 64] [--in-flight 8] [--json OUT.json]

Why: V4.1 quantizes what it caches (FP8 SWA records, FP4 main KV and index keys), so a value
within a few fp32 ulps of a rounding boundary lands on either side depending on summation order,
and the model then moves by one quantum: on the tiny checkpoint a relative perturbation of 1e-7
in fp32 changes later logprobs by up to ~0.5, and the fp32 and fp64 oracles on one CPU already
disagree on 9-10 of the GPU check's 24 prompts (docs/gpu_e2e.md, "Rounding"). Two fp32
implementations that round differently therefore cannot be held to equal tokens everywhere. In
float64 the same boundary needs a 1e-16 coincidence, so the serving path and the oracle must
agree on every prompt: a real difference in the serving path (masks, windows, slots, replay,
chunking, batching, the device) still shows as a different token or a logprob error far above
`TOL`.

The serving path here is `serving/` under `serving.toy.ToyEngine` (the scheduler's part), in
float64 on `device`: the kernels' dispatchers run their torch references for float64 inputs
(the fast paths take bf16 / fp32). Prompts are prefilled `chunk` tokens at a time, `in_flight`
requests at once, then decoded greedily together, for replay on and off. The oracle's float64
answers come from ANSWERS.json (scripts/gpu_e2e/reference.py writes them: keys "prompts",
"new", "replay64", "full64"), or are computed here when the file lacks them.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys

import torch

TOL = 1e-8  # logprob error allowed between the fp64 serving path and the fp64 oracle
MODES = (("replay", True), ("full", False))


@torch.no_grad()
def oracle_steps(model, prompt: list[int], new: int, replay: bool) -> list[dict]:
    """The oracle's greedy continuation by full recomputation: per step the token, its logprob
    and the margin (top-1 minus top-2 logit)."""
    ids, steps = list(prompt), []
    floor = model.replay_floor_for(len(prompt), replay)
    for _ in range(new):
        logits = model(torch.tensor(ids), replay_floor=floor)[-1].double()
        steps.append(step_record(logits))
        ids.append(steps[-1]["token"])
    return steps


def step_record(logits: torch.Tensor) -> dict:
    """logits [V] -> {token, logprob, margin} of the greedy choice."""
    logits = logits.double()
    top2 = torch.topk(logits, 2)
    tok = int(top2.indices[0])
    return {
        "token": tok,
        "logprob": float(torch.log_softmax(logits, -1)[tok]),
        "margin": float(top2.values[0] - top2.values[1]),
    }


@torch.no_grad()
def served_steps(model, prompts, new, replay, device, chunk, in_flight) -> list[list[dict]]:
    """The serving path's greedy steps for every prompt, `in_flight` requests per engine."""
    from sglang_dsv41.serving.toy import ToyEngine, serve

    out = []
    for g in range(0, len(prompts), in_flight):
        group = prompts[g : g + in_flight]
        max_len = max(len(p) for p in group) + new + 2
        pages = len(group) * (max_len // 2 + 2) + 8
        eng = ToyEngine(
            model, max_len, pages, replay=replay, device=device, max_requests=len(group)
        )
        floors = [model.cfg.replay_floor(len(p)) for p in group] if replay else None
        rows = [[] for _ in group]
        serve(eng, group, new, chunk=chunk, floors=floors, logits_out=rows)
        out += [[step_record(r) for r in req] for req in rows]
    return out


def compare(got: list[dict], want: list[dict], tol: float = TOL) -> dict:
    """Per prompt: first differing step (None), the oracle's margin there, worst logprob error
    over the steps before it, and a verdict (equal / differs)."""
    diffs = (k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a["token"] != b["token"])
    first = next(diffs, None)
    upto = len(want) if first is None else first
    pairs = zip(got[:upto], want[:upto], strict=False)
    err = max((abs(a["logprob"] - b["logprob"]) for a, b in pairs), default=0.0)
    ok = first is None and err <= tol and len(got) == len(want)
    return {
        "verdict": "equal" if ok else "differs",
        "first_diff": first,
        "margin": None if first is None else want[first]["margin"],
        "logprob_err": err,
    }


def run(oracle, answers: dict, device="cpu", chunk=64, in_flight=8, tol=TOL) -> dict:
    """The float64 twin check of a float64 ReferenceModel on CPU; answers: {"prompts", "new"}
    and optionally the oracle's "replay64" / "full64" steps (else computed here).
    Returns {"modes": {mode: [per prompt]}, "passed": bool, ...}."""
    from sglang_dsv41.tools.progress import progress

    if oracle.embed.weight.dtype != torch.float64:
        raise ValueError(
            "twin_check: the model must be float64 (load_reference(path, torch.float64))"
        )
    served = copy.deepcopy(oracle).to(device)
    prompts, new = answers["prompts"], int(answers["new"])
    res = {"device": str(device), "chunk": chunk, "in_flight": in_flight, "tol": tol, "modes": {}}
    for mode, replay in MODES:
        want = answers.get(f"{mode}64")
        if want is None:
            want = []
            for k, p in enumerate(prompts, start=1):
                want.append(oracle_steps(oracle, p, new, replay))
                progress(k, len(prompts), f"fp64 oracle, {mode}")
        got = served_steps(served, prompts, new, replay, device, chunk, in_flight)
        res["modes"][mode] = [
            {"len": len(p), **compare(g, w, tol)}
            for p, g, w in zip(prompts, got, want, strict=True)
        ]
    res["passed"] = all(r["verdict"] == "equal" for m in res["modes"].values() for r in m)
    return res


@torch.no_grad()
def device_oracle(model, answers: dict, device) -> dict:
    """The fp32 oracle on `device` (full recomputation there): {"replay": [...], "full": [...]}
    steps per prompt, another correct fp32 arithmetic beside the CPU's (docs/gpu_e2e.md)."""
    model = copy.deepcopy(model).to(device)
    out = {}
    with torch.device(device):
        for mode, replay in MODES:
            out[mode] = [
                oracle_steps(model, p, int(answers["new"]), replay) for p in answers["prompts"]
            ]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--answers", required=True, help="prompts (+ fp64 oracle answers) JSON")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--in-flight", type=int, default=8)
    ap.add_argument("--json", help="write the per-prompt results here")
    ap.add_argument("--oracle32-json", help="also run the fp32 oracle on the device, write here")
    a = ap.parse_args(argv)
    with open(a.answers) as f:
        answers = json.load(f)
    from sglang_dsv41.reference import load_reference

    oracle = load_reference(a.checkpoint, dtype=torch.float64)
    res = run(oracle, answers, torch.device(a.device), a.chunk, a.in_flight)
    for mode, rows in res["modes"].items():
        eq = sum(r["verdict"] == "equal" for r in rows)
        worst = max(r["logprob_err"] for r in rows)
        print(f"twin {mode}: {eq}/{len(rows)} equal, worst logprob error {worst:.2e}")
        for r in rows:
            if r["verdict"] != "equal":
                print(f"  len {r['len']}: {r}")
    print(f"VERDICT twin fp64 on {a.device}: {'PASS' if res['passed'] else 'FAIL'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    if a.oracle32_json:
        fp32 = load_reference(a.checkpoint)
        with open(a.oracle32_json, "w") as f:
            json.dump(device_oracle(fp32, answers, torch.device(a.device)), f)
        print(f"fp32 oracle on {a.device}: {a.oracle32_json}")
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
