"""The CPU oracle's answers for the GPU end-to-end check (run here, before prepare.sh packs).

    .venv/bin/python scripts/gpu_e2e/reference.py CHECKPOINT_DIR OUT_JSON [--new 16]

For each prompt (fixed pseudo-random token ids, lengths 1..400: one chunk or several, far past
the tiny model's window of 16, its top-k of 8 entries and its candidate pool of 48 positions)
and each replay mode, the oracle's greedy tokens by full recomputation and, at every step, the
logprob of its token and its margin (top-1 minus top-2 logit), so the device can tell a real
disagreement from a near-tie. The checkpoint's sha256 lets the device check it rebuilt the same
weights.
"""

import argparse
import hashlib
import json
import os
import random

import torch

from sglang_dsv41.reference import load_reference

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


@torch.no_grad()
def greedy(model, prompt, new, replay):
    ids, steps = list(prompt), []
    floor = model.replay_floor_for(len(prompt), replay)
    for _ in range(new):
        logits = model(torch.tensor(ids), replay_floor=floor)[-1].double()
        top2 = torch.topk(logits, 2)
        tok = int(top2.indices[0])
        steps.append(
            {
                "token": tok,
                "logprob": float(torch.log_softmax(logits, -1)[tok]),
                "margin": float(top2.values[0] - top2.values[1]),
            }
        )
        ids.append(tok)
    return steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("out")
    ap.add_argument("--new", type=int, default=16)
    a = ap.parse_args()
    torch.set_num_threads(1)
    model = load_reference(a.checkpoint)
    rng = random.Random(1234)
    prompts = [[rng.randrange(2, model.cfg.vocab_size) for _ in range(n)] for n in LENGTHS]
    out = {"new": a.new, "prompts": prompts, "replay": [], "full": []}
    for p in prompts:
        for mode, replay in (("replay", True), ("full", False)):
            out[mode].append(greedy(model, p, a.new, replay))
        print(f"len {len(p):4d} done", flush=True)
    with open(os.path.join(a.checkpoint, "model.safetensors"), "rb") as f:
        out["checkpoint_sha256"] = hashlib.sha256(f.read()).hexdigest()
    with open(a.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
