"""The CPU oracle's answers for the GPU end-to-end check (run here, before prepare.sh packs).

    .venv/bin/python scripts/gpu_e2e/reference.py CHECKPOINT_DIR OUT_JSON [--new 16]

For each prompt (fixed pseudo-random token ids, lengths 1..400: one chunk or several, far past
the tiny model's window of 16, its top-k of 8 entries and its candidate pool of 48 positions)
and each replay mode, the oracle's greedy tokens by full recomputation and, at every step, the
logprob of its token and its margin (top-1 minus top-2 logit), so the device can tell a real
disagreement from a near-tie. The same for the oracle in float64 (keys "replay64", "full64"):
where the fp32 and fp64 oracles already disagree, fp32 rounding decides the answer (the client's
rounding horizon), and the device's twin check (tools/twin_check.py) holds the serving path in
float64 to these answers. The checkpoint's sha256 lets the device check it rebuilt the same
weights.
"""

import argparse
import hashlib
import json
import os
import random

import torch

from sglang_dsv41.reference import load_reference
from sglang_dsv41.tools.twin_check import oracle_steps

LENGTHS = [
    1,
    2,
    5,
    8,
    15,
    16,
    17,
    20,
    31,
    33,
    41,
    48,
    49,
    64,
    66,
    97,
    128,
    131,
    150,
    201,
    256,
    300,
    333,
    400,
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("out")
    ap.add_argument("--new", type=int, default=16)
    a = ap.parse_args()
    torch.set_num_threads(1)
    models = {"": load_reference(a.checkpoint), "64": load_reference(a.checkpoint, torch.float64)}
    rng = random.Random(1234)
    V = models[""].cfg.vocab_size
    prompts = [[rng.randrange(2, V) for _ in range(n)] for n in LENGTHS]
    out = {"new": a.new, "prompts": prompts}
    for p in prompts:
        for suffix, model in models.items():
            for mode, replay in (("replay", True), ("full", False)):
                out.setdefault(mode + suffix, []).append(oracle_steps(model, p, a.new, replay))
        print(f"len {len(p):4d} done", flush=True)
    with open(os.path.join(a.checkpoint, "model.safetensors"), "rb") as f:
        out["checkpoint_sha256"] = hashlib.sha256(f.read()).hexdigest()
    with open(a.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
