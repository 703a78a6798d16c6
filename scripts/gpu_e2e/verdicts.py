"""How client.py judges one served answer against the oracles (stdlib only; docs/gpu_e2e.md).

steps: the fp32 CPU oracle's greedy steps [{token, logprob, margin}]; steps64: the fp64 oracle's
(None where the reference has none); got: the served tokens; served: SGLang's
output_token_ids_logprobs rows ([[logprob, token_id, ...], ...] per step).
"""

NEAR_TIE = 0.02  # logits: a disagreement below this oracle margin is a tie, not an error
LOGPROB_TOL = 2e-3


def first_mismatch(got, want):
    return next((i for i, (x, y) in enumerate(zip(got, want, strict=False)) if x != y), None)


def horizon(steps, steps64):
    """The first step where the fp32 and fp64 oracles disagree (token, or logprob beyond
    LOGPROB_TOL); len(steps) where they agree throughout or no fp64 answers exist."""
    if steps64 is None:
        return len(steps)
    for i, (s32, s64) in enumerate(zip(steps, steps64, strict=True)):
        if s32["token"] != s64["token"] or abs(s32["logprob"] - s64["logprob"]) > LOGPROB_TOL:
            return i
    return len(steps)


def judge(got, steps, steps64=None, follows64=None):
    """-> ('equal' | 'near_tie' | 'rounding' | 'differs', first mismatch, oracle margin there).
    follows64: the server follows the fp64 oracle throughout (default: its tokens are equal)."""
    want = [s["token"] for s in steps]
    k = first_mismatch(got, want)
    if k is None and len(got) == len(want):
        return "equal", None, None
    if k is None:
        return "differs", len(got), None
    margin = steps[k]["margin"]
    if margin < NEAR_TIE:
        return "near_tie", k, margin
    if follows64 is None:
        follows64 = steps64 is not None and got == [s["token"] for s in steps64]
    if k >= horizon(steps, steps64) or follows64:
        return "rounding", k, margin
    return "differs", k, margin


def logprob_error(served, steps, upto):
    """Worst |served - oracle| logprob of the oracle's tokens over the first `upto` steps."""
    errs = []
    for j in range(min(upto, len(served))):
        vals = {int(t): float(v) for v, t, *_ in served[j]}
        errs.append(abs(vals.get(steps[j]["token"], float("inf")) - steps[j]["logprob"]))
    return max(errs, default=0.0)
