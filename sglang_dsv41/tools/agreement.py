"""Does our server compute the model stock SGLang and the oracle compute? Greedy continuations
and teacher-forced top-1 agreement on PROMPT_LENS (24 prompts of 16 to 8,192 random tokens).

    python -m sglang_dsv41.tools.agreement run --model-path DIR --work W [--profile marlin]
        stock server: greedy continuations; ours: greedy continuations and teacher-forced scores
        of stock's continuations (W/stock_gen.json, W/ours_gen.json, W/ours_on_stock.json)
    python -m sglang_dsv41.tools.agreement oracle --model-path DIR --work W [--device cuda]
        the oracle in the server's numerics scores ours' continuations (W/oracle_on_ours.json)
    python -m sglang_dsv41.tools.agreement judge --work W      verdict lines, W/agreement.json

Teacher forcing: the scorer reads prompt + the other side's continuation in one prefill and
gives, at every continuation position, its top-1 token and its log-probability deficit of the
other side's token, d = logprob(top-1) - logprob(token) >= 0 (d = 0 where they agree). The
oracle (`packed_oracle`) runs with the served numerics switched on (the FP8 linears' activation
quantization, bf16 attention queries and output) and the generation's replay floor.

Thresholds, fixed before any run (a random-weight model's top-1 and top-2 logits are often
close: with logits of std ~1 over 129,280 entries the expected gap is ~0.2 nats, so the rules
bound the deficit, not only the agreement):
    ours vs oracle   top-1 agreement >= 0.90; every disagreement a near-tie (d <= TOL_NATS);
                     every prompt's greedy continuation equal up to its first near-tie
    ours vs stock    top-1 agreement >= 0.80; >= 99 % of positions with d <= TOL_NATS;
                     >= 90 % of prompts' first greedy divergence at a near-tie (ours' d)
TOL_NATS = 0.25, the GPU node check's tolerance.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

PROMPT_LENS = (16, 23, 32, 45, 64, 91, 100, 128, 181, 256, 300, 362, 512, 724, 1024, 1448,
               1500, 2048, 2896, 3000, 4096, 5793, 6000, 8192)  # fmt: skip
NEW_TOKENS = 32
TOL_NATS = 0.25
THRESHOLDS = {
    "oracle": {"agreement": 0.90, "within_tol": 1.0, "greedy_near_tie": 1.0},
    "stock": {"agreement": 0.80, "within_tol": 0.99, "greedy_near_tie": 0.90},
}


def prompts(vocab: int, seed: int = 4321) -> list:
    """Token ids [2, vocab) of every PROMPT_LENS length (ids 0 and 1 are bos / eos)."""
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(n)] for n in PROMPT_LENS]


def generate(url: str, ps: list, new: int = NEW_TOKENS) -> list:
    """Greedy continuations, one request per prompt, no logprobs (they move the replay floor)."""
    from sglang_dsv41.tools.head_to_head import post_json

    outs = []
    for p in ps:
        body = {
            "input_ids": p,
            "sampling_params": {"temperature": 0, "max_new_tokens": new, "ignore_eos": True},
        }
        outs.append(post_json(url + "/generate", body)["output_ids"])
    return outs


def score(url: str, ps: list, conts: list) -> list:
    """Teacher-forced: per prompt {"top1": [...], "deficit": [...]} at each continuation token."""
    from sglang_dsv41.tools.head_to_head import post_json

    rows = []
    for p, c in zip(ps, conts, strict=True):
        body = {
            "input_ids": p + c,
            "sampling_params": {"temperature": 0, "max_new_tokens": 1},
            "return_logprob": True,
            "logprob_start_len": len(p) - 1,  # its own entry is empty: SGLang predicts none
            "top_logprobs_num": 1,
        }
        meta = post_json(url + "/generate", body)["meta_info"]
        got = meta["input_token_logprobs"][-len(c) :]
        top = meta["input_top_logprobs"][-len(c) :]
        if [int(t[1]) for t in got] != [int(t) for t in c]:
            raise RuntimeError(f"prompt of {len(p)}: input logprobs do not line up with its tokens")
        rows.append(
            {
                "top1": [int(t[0][1]) for t in top],
                "deficit": [
                    max(0.0, float(t[0][0]) - float(g[0])) for t, g in zip(top, got, strict=True)
                ],
            }
        )
    return rows


def first_divergence(a: list, b: list):
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return k
    return None


def judge(kind: str, conts: list, scored: list, other_conts: list | None = None) -> dict:
    """The figures and verdict of one comparison: `scored` is the scorer's teacher-forced view of
    `conts`; greedy divergences against `other_conts` (the scorer's own continuations) are judged
    by the deficit at the first differing step (None: the scorer's top-1 run is the reference)."""
    n = agree = within = 0
    deficits = []
    for c, s in zip(conts, scored, strict=True):
        for tok, top, d in zip(c, s["top1"], s["deficit"], strict=True):
            n += 1
            agree += top == tok
            within += d <= TOL_NATS
            deficits.append(d)
    greedy_ok = equal = 0
    divergences = []
    for i, (c, s) in enumerate(zip(conts, scored, strict=True)):
        ref = other_conts[i] if other_conts is not None else s["top1"]
        k = first_divergence(c, ref)
        if k is None:
            equal += 1
            greedy_ok += 1
            divergences.append(None)
            continue
        divergences.append({"step": k, "deficit": s["deficit"][k]})
        greedy_ok += s["deficit"][k] <= TOL_NATS
    deficits.sort()
    rule = THRESHOLDS[kind]
    fig = {
        "positions": n,
        "agreement": agree / n,
        "within_tol": within / n,
        "greedy_equal": equal,
        "greedy_near_tie": greedy_ok / len(conts),
        "deficit_p99": deficits[int(0.99 * (n - 1))],
        "deficit_max": deficits[-1],
        "divergences": divergences,
    }
    fig["pass"] = all(fig[k] >= v for k, v in rule.items())
    return fig


def verdict_line(kind: str, fig: dict) -> str:
    rule = THRESHOLDS[kind]
    return (
        f"VERDICT ours-vs-{kind}: {'PASS' if fig['pass'] else 'FAIL'}: top-1 "
        f"{fig['agreement']:.3f} (>= {rule['agreement']}), d <= {TOL_NATS} at "
        f"{fig['within_tol']:.3f} (>= {rule['within_tol']}), greedy {fig['greedy_equal']}/"
        f"{len(fig['divergences'])} equal, near-tie divergences {fig['greedy_near_tie']:.2f} "
        f"(>= {rule['greedy_near_tie']}); deficit p99 {fig['deficit_p99']:.3f}, max "
        f"{fig['deficit_max']:.3f} over {fig['positions']} positions"
    )


def _load(path: Path):
    return json.loads(path.read_text())


def _dump(path: Path, obj) -> None:
    path.write_text(json.dumps(obj) + "\n")


def write_prompts(model_path: str, work: Path) -> None:
    """work/prompts.json: the prompts both sides continue."""
    from sglang_dsv41.config import DeepseekV41Config

    work.mkdir(parents=True, exist_ok=True)
    _dump(work / "prompts.json", prompts(DeepseekV41Config.from_hf(model_path).vocab_size))


def serve_side(url: str, side: str, work: Path) -> None:
    """One side's part on its running server: greedy continuations of work/prompts.json
    (work/SIDE_gen.json); ours also scores stock's continuations when they are there
    (work/ours_on_stock.json), so stock runs first."""
    ps = _load(work / "prompts.json")
    _dump(work / f"{side}_gen.json", generate(url, ps))
    if side == "ours" and (work / "stock_gen.json").exists():
        _dump(work / "ours_on_stock.json", score(url, ps, _load(work / "stock_gen.json")))


def census_env(side: str, work: Path) -> dict:
    """The op census of one side's server processes, under work/census_SIDE."""
    return {"DSV41_OP_CENSUS": str(work / f"census_{side}")}


def run_servers(model_path: str, work: Path, settings, timeout: float) -> None:
    from sglang_dsv41.tools.head_to_head import Server

    write_prompts(model_path, work)
    for side in ("stock", "ours"):
        env = census_env(side, work)
        try:
            with Server(side, model_path, work / f"{side}.log", settings, env_extra=env) as srv:
                print(f"{side}: ready in {srv.wait_ready(timeout):.0f} s", flush=True)
                serve_side(srv.url, side, work)
        except (RuntimeError, OSError) as e:  # one side failing still leaves the other's
            print(f"{side}: FAILED: {str(e)[-3000:]}", flush=True)
            continue
        print(f"{side}: done", flush=True)


def judge_dir(work: Path) -> dict:
    out, lines = {}, []
    if not (work / "ours_gen.json").exists():
        print("VERDICT: FAIL: no continuations of ours (the ours server did not serve)")
        return {}
    ours = _load(work / "ours_gen.json")
    if (work / "ours_on_stock.json").exists():
        stock = _load(work / "stock_gen.json")
        out["stock"] = judge("stock", stock, _load(work / "ours_on_stock.json"), ours)
        lines.append(verdict_line("stock", out["stock"]))
    if (work / "oracle_on_ours.json").exists():
        out["oracle"] = judge("oracle", ours, _load(work / "oracle_on_ours.json"))
        lines.append(verdict_line("oracle", out["oracle"]))
    _dump(work / "agreement.json", {"thresholds": THRESHOLDS, "tol_nats": TOL_NATS, **out})
    print("\n".join(lines))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_dsv41.tools.agreement", description=__doc__)
    ap.add_argument("step", choices=("run", "oracle", "judge"))
    ap.add_argument("--model-path")
    ap.add_argument("--work", required=True)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--start-timeout", type=float, default=600)
    a = ap.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    if a.step == "run":
        from sglang_dsv41.tools.head_to_head import Settings

        s = Settings() if a.profile is None else Settings(profile=a.profile)
        run_servers(a.model_path, work, s, a.start_timeout)
    elif a.step == "oracle":
        from sglang_dsv41.tools.packed_oracle import score_continuations

        ps, ours = _load(work / "prompts.json"), _load(work / "ours_gen.json")
        _dump(work / "oracle_on_ours.json", score_continuations(a.model_path, ps, ours, a.device))
    else:
        out = judge_dir(work)
        return 0 if out and all(v["pass"] for v in out.values()) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
