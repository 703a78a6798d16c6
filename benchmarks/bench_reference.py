"""Time the oracle: greedy generation by full recomputation on a preset checkpoint.

    python benchmarks/bench_reference.py [--preset tiny] [--prompt-len 512] [--new 32]
        [--threads 1] [--replay|--no-replay]

Creates the checkpoint in a temporary directory, then times `ReferenceModel.generate` (weights
loaded, imports done) and the whole CLI process (`python -m sglang_dsv41.reference`), which is
what a user waits for. Prints one JSON line.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--replay", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from sglang_dsv41.reference import load_reference
    from sglang_dsv41.tools.make_checkpoint import main as make_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, args.preset)
        make_checkpoint(["--preset", args.preset, "--out", ckpt])
        model = load_reference(ckpt)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(30, model.cfg.vocab_size, (args.prompt_len,), generator=g).tolist()
        t0 = time.perf_counter()
        out = model.generate(ids, args.new, replay=args.replay)
        gen_s = time.perf_counter() - t0
        cmd = [
            sys.executable,
            "-m",
            "sglang_dsv41.reference",
            "--model",
            ckpt,
            "--input-ids",
            ",".join(map(str, ids)),
            "--max-new-tokens",
            str(args.new),
            "--threads",
            str(args.threads),
        ] + ([] if args.replay else ["--no-replay"])
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        cli_s = time.perf_counter() - t0
        assert json.loads(r.stdout.strip().splitlines()[-1])["output_ids"] == out
    print(
        json.dumps(
            {
                "preset": args.preset,
                "prompt_len": args.prompt_len,
                "new": args.new,
                "threads": args.threads,
                "replay": args.replay,
                "generate_s": round(gen_s, 2),
                "cli_process_s": round(cli_s, 2),
                "distinct_tokens": len(set(out)),
                "load_avg": os.getloadavg()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
