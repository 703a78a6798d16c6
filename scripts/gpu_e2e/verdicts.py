"""How client.py judges one served answer against the oracles (stdlib only; docs/gpu_e2e.md).

steps: the fp32 CPU oracle's greedy steps [{token, logprob, margin}]; variants: the same from
other correct arithmetics (the fp64 oracle, the fp32 oracle on the GPU); got: the served tokens;
served: SGLang's output_token_ids_logprobs rows ([[logprob, token_id, ...], ...] per step).
"""

NEAR_TIE = 0.02  # logits: a disagreement below this oracle margin is a tie, not an error
LOGPROB_TOL = 2e-3


def first_mismatch(got, want):
    return next((i for i, (x, y) in enumerate(zip(got, want, strict=False)) if x != y), None)


def horizon(steps, variants=()):
    """The first step where the fp32 CPU oracle and another oracle (fp64, or fp32 on the GPU)
    disagree: a token, or a logprob beyond LOGPROB_TOL. len(steps) where all agree throughout."""
    h = len(steps)
    for other in variants or ():
        for i, (a, b) in enumerate(zip(steps, other, strict=True)):
            if a["token"] != b["token"] or abs(a["logprob"] - b["logprob"]) > LOGPROB_TOL:
                h = min(h, i)
                break
    return h


def judge(got, steps, variants=(), follows=None):
    """-> ('equal' | 'near_tie' | 'rounding' | 'differs', first mismatch, oracle margin there).
    variants: other oracles' steps for this prompt; follows: the server follows one of them
    throughout (default: its tokens equal one variant's)."""
    variants = [v for v in variants or () if v is not None]
    want = [s["token"] for s in steps]
    k = first_mismatch(got, want)
    if k is None and len(got) == len(want):
        return "equal", None, None
    if k is None:
        return "differs", len(got), None
    margin = steps[k]["margin"]
    if margin < NEAR_TIE:
        return "near_tie", k, margin
    if follows is None:
        follows = any(got == [s["token"] for s in v] for v in variants)
    if k >= horizon(steps, variants) or follows:
        return "rounding", k, margin
    return "differs", k, margin


def logprob_error(served, steps, upto):
    """Worst |served - oracle| logprob of the oracle's tokens over the first `upto` steps."""
    errs = []
    for j in range(min(upto, len(served))):
        vals = {int(t): float(v) for v, t, *_ in served[j]}
        errs.append(abs(vals.get(steps[j]["token"], float("inf")) - steps[j]["logprob"]))
    return max(errs, default=0.0)
