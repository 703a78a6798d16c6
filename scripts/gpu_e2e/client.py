"""Drive one `launch_server` on the GPU machine and hold it to the CPU oracle (stdlib only).

    python3 client.py URL REFERENCE_JSON OUT_JSON --mode replay|full [--pid PID]

Checks, each recorded in OUT_JSON and summed up in one verdict line:
  /generate, one prompt at a time: greedy tokens equal the oracle's, or the first disagreement
      sits where the oracle's top-1/top-2 margin is below NEAR_TIE (reported with the margin),
      or at or after the prompt's rounding horizon: the first step where the fp32 oracle and the
      fp64 oracle (REFERENCE_JSON's "<mode>64") already disagree, so fp32 arithmetic does not
      determine the answer there (docs/gpu_e2e.md, "Rounding"); a server that follows the fp64
      oracle's tokens and logprobs all the way also counts as "rounding". The served logprob of
      the oracle's token within LOGPROB_TOL of the oracle's at every step before the first
      disagreement and before the horizon (asked as token_ids_logprob, which also checks that
      asking for output logprobs leaves the tokens unchanged);
  16 requests in flight at once, the same rule;
  a radix hit (a prompt sharing 300 tokens with an earlier one) reuses cached tokens and still
      follows the rule;
  /v1/completions and /v1/chat/completions, streaming and not: the same text both ways, and
      /v1/completions the same text as /generate.
Exit 0 when every check passed, 1 when one failed, 2 when the server never answered.
"""

import argparse
import concurrent.futures as cf
import json
import os
import sys
import time
import urllib.error
import urllib.request

from verdicts import LOGPROB_TOL, NEAR_TIE, horizon, judge, logprob_error

ap = argparse.ArgumentParser()
ap.add_argument("url")
ap.add_argument("reference")
ap.add_argument("out")
ap.add_argument("--mode", choices=["replay", "full"], required=True)
ap.add_argument("--pid", type=int, default=0)
ap.add_argument("--start-timeout", type=float, default=240)
ap.add_argument("--variants", nargs="*", default=[], help="JSON files of other oracles' steps")
a = ap.parse_args()
ref = json.load(open(a.reference))
steps_of = ref[a.mode]
# other oracles of the same prompts: fp64 on the CPU (the reference file), fp32 on this GPU
variants_of = [[v] for v in ref.get(a.mode + "64") or [None] * len(steps_of)]
for path in a.variants:
    with open(path) as f:
        for row, v in zip(variants_of, json.load(f)[a.mode], strict=True):
            row.append(v)
variants_of = [[v for v in row if v is not None] for row in variants_of]
result = {"mode": a.mode, "checks": {}, "prompts": []}


def dump():
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


def http(path, body=None, timeout=120.0, stream=False):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        a.url + path, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            if stream:
                events = []
                for line in r:
                    line = line.decode().strip()
                    if line.startswith("data:") and line[5:].strip() != "[DONE]":
                        events.append(json.loads(line[5:]))
                return r.status, events
            return r.status, json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:2000]


def alive():
    if not a.pid:
        return True
    try:
        os.kill(a.pid, 0)
        return True
    except OSError:
        return False


def generate(prompt, n, token_ids=None):
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
    }
    if token_ids:
        body.update(return_logprob=True, token_ids_logprob=token_ids)
    status, out = http("/generate", body)
    if status != 200 or "output_ids" not in out:
        raise RuntimeError(f"HTTP {status}: {out}")
    return out


t0 = time.time()
while True:
    try:
        if http("/get_model_info", timeout=5)[0] == 200:
            break
    except Exception:
        pass
    if not alive() or time.time() - t0 > a.start_timeout:
        result["error"] = "server did not answer"
        dump()
        print("VERDICT: server did not answer", flush=True)
        sys.exit(2)
    time.sleep(1)
result["ready_s"] = round(time.time() - t0, 1)
_, info = http("/get_server_info")
keys = (
    "attention_backend",
    "device",
    "dtype",
    "page_size",
    "disable_cuda_graph",
    "cuda_graph_config",
    "chunked_prefill_size",
    "max_total_num_tokens",
    "max_running_requests",
)
result["server_info"] = {k: info.get(k) for k in keys} if isinstance(info, dict) else info
print("server_info", json.dumps(result["server_info"]), flush=True)
counts = {"equal": 0, "near_tie": 0, "rounding": 0, "differs": 0}
worst_lp, failures = 0.0, []

# 1. one at a time, with logprobs of the oracles' tokens, then plain
for i, (prompt, steps, variants) in enumerate(
    zip(ref["prompts"], steps_of, variants_of, strict=True)
):
    want = [s["token"] for s in steps]
    asked = set(want) | {s["token"] for v in variants for s in v}
    try:
        lp = generate(prompt, len(want), token_ids=sorted(asked))
        plain = generate(prompt, len(want))
    except Exception as e:
        failures.append(f"prompt {i}: {e!r}"[:300])
        continue
    got = plain["output_ids"]
    served = lp["meta_info"].get("output_token_ids_logprobs") or []
    followed = [
        v
        for v in variants
        if got == [s["token"] for s in v] and logprob_error(served, v, len(v)) <= LOGPROB_TOL
    ]
    verdict, k, margin = judge(got, steps, variants, bool(followed))
    h = horizon(steps, variants)
    err = logprob_error(served, steps, min(len(want) if k is None else k, h))
    if followed and err > LOGPROB_TOL:
        verdict, err = "rounding", logprob_error(served, followed[0], len(followed[0]))
    counts[verdict] += 1
    worst_lp = max(worst_lp, err)
    same = lp["output_ids"] == got
    result["prompts"].append(
        {
            "len": len(prompt),
            "verdict": verdict,
            "first_diff": k,
            "margin": margin,
            "horizon": h,
            "logprob_err": err,
            "logprob_same_ids": same,
        }
    )
    print(
        f"len {len(prompt):4d} {verdict:8s} first_diff={k} margin={margin} horizon={h} "
        f"logprob_err={err:.2e} same_ids_with_logprobs={same}",
        flush=True,
    )
    if verdict == "differs":
        failures.append(f"len {len(prompt)}: differs at {k} (oracle margin {margin})")
    if err > LOGPROB_TOL:
        failures.append(f"len {len(prompt)}: logprob error {err:.3g}")
    if not same:
        failures.append(f"len {len(prompt)}: asking for logprobs changed the tokens")
    dump()
result["checks"]["sequential"] = dict(counts, worst_logprob_err=worst_lp)

# 2. sixteen in flight
with cf.ThreadPoolExecutor(16) as ex:
    idx = list(range(len(ref["prompts"])))[-16:]
    futs = {i: ex.submit(generate, ref["prompts"][i], ref["new"]) for i in idx}
conc = {"equal": 0, "near_tie": 0, "rounding": 0, "differs": 0}
for i, f in futs.items():
    try:
        v, k, m = judge(f.result()["output_ids"], steps_of[i], variants_of[i])
    except Exception as e:
        failures.append(f"in flight {i}: {e!r}"[:300])
        continue
    conc[v] += 1
    if v == "differs":
        failures.append(f"in flight len {len(ref['prompts'][i])}: differs at {k} (margin {m})")
result["checks"]["in_flight_16"] = conc
print("16 in flight:", conc, flush=True)

# 3. a radix hit: the 400-token prompt's first 300 tokens are cached by now
p = ref["prompts"][-1][:300] + [7, 8, 9]
hit = generate(p, 4)
cached = hit["meta_info"].get("cached_tokens", 0)
result["checks"]["radix_hit_cached_tokens"] = cached
if cached < 200:
    failures.append(f"radix hit reused only {cached} tokens")
print("radix hit: cached", cached, flush=True)

# 4. OpenAI routes: the same text streaming and not, and as /generate
p = ref["prompts"][12]
body = {"model": "m", "prompt": p, "max_tokens": 8, "temperature": 0}
s1, comp = http("/v1/completions", body)
s2, events = http("/v1/completions", {**body, "stream": True}, stream=True)
gen = generate(p, 8)
text = comp["choices"][0]["text"] if s1 == 200 else None
streamed = "".join(e["choices"][0].get("text") or "" for e in events) if s2 == 200 else None
chat = {
    "model": "m",
    "messages": [{"role": "user", "content": "Hello there, how are you?"}],
    "max_tokens": 8,
    "temperature": 0,
}
s3, c1 = http("/v1/chat/completions", chat)
s4, ev = http("/v1/chat/completions", {**chat, "stream": True}, stream=True)
content = c1["choices"][0]["message"]["content"] or "" if s3 == 200 else None
cstream = (
    "".join((e["choices"][0]["delta"].get("content") or "") for e in ev if e.get("choices"))
    if s4 == 200
    else None
)
openai_ok = (
    text is not None
    and text == streamed == gen["text"]
    and content is not None
    and content == cstream
)
result["checks"]["openai_routes"] = openai_ok
if not openai_ok:
    failures.append(
        f"openai routes: {s1} {s2} {s3} {s4} {text!r} {streamed!r} {gen['text']!r} "
        f"{content!r} {cstream!r}"[:500]
    )
print("openai routes consistent:", openai_ok, flush=True)

result["failures"] = failures
dump()
n = len(ref["prompts"])
print(
    f"VERDICT {a.mode}: {'PASS' if not failures else 'FAIL'}: sequential {counts['equal']}/{n} "
    f"equal, {counts['near_tie']} near-ties (< {NEAR_TIE}), {counts['rounding']} past the "
    f"rounding horizon, {counts['differs']} differ; "
    f"worst logprob error {worst_lp:.2e} (tol {LOGPROB_TOL}); 16 in flight {conc}; "
    f"radix hit cached {cached}; openai routes {openai_ok}",
    flush=True,
)
for f in failures:
    print("  FAIL", f, flush=True)
sys.exit(1 if failures else 0)
