"""What CSA2's shortcuts drop: candidate-pool recall of Reindex layers, top-k agreement of Reuse
layers, per context length.

    python -m sglang_dsv41.tools.recall_report --model DIR [--prompts FILE]
        [--contexts 256,512,...] [--rows 16] [--json OUT.json] [--plot OUT.png]
    python -m sglang_dsv41.tools.recall_report --model DIR --needle 1024,4096,16384
        [--per-length 8] [--json OUT.json]

With --needle (a model trained on the retrieval task, docs/retrieval_model.md) the question is
the one that matters for retrieval: in held-out documents, at the row that writes the answer's
first digit, did the candidate pool and each decoder index source's top-k hold the asked fact's
entry (`training.needle_recall`). Otherwise, over any text:

One oracle forward (`sglang_dsv41.reference`, full forward, no replay) over a prompt as long as
the longest context; a capture hook keeps each global layer's attention queries and each index
layer's indexer queries for the last `rows` query rows before every context length, and the
oracle's SharedState keeps what the layers selected. For those rows, per layer:

    pool_recall   (Reindex) the share of the unrestricted top-k (the layer's own index scores
                  over every visible entry, `layers.index_math`) that the candidate pool kept.
                  The layer's served top-k is its top-k inside the pool, so this is also the
                  share of the unrestricted top-k it attends.
    reuse_overlap (Reuse) the share of the top-k the layer's own queries would choose that its
                  index source's top-k (what it reuses) contains. A Reuse layer has no indexer,
                  so "its own choice" is the top-k by its own attention: the probability mass
                  p[s] = mean over heads of softmax_s(q_h . K[s] * scale) over every visible
                  main-KV entry of its kv source (the dense version of its global branch).
    attn_mass     (every global layer) the share of that dense attention mass p that the top-k
                  the layer attends covers: 1.0 means selection lost nothing this layer's
                  queries would have looked at. For Full layers it measures the indexer itself.
Rows with no more visible entries than top-k select everything and score 1.0. Results are means
over the rows (min also kept in the JSON). "chance" is what a uniformly random choice scores:
pool entries / visible entries for pool_recall, top-k / visible entries for the others.
Contexts stop at the config's max_position_embeddings. Random weights say little about a
trained model: a trained indexer and trained attention concentrate their scores where random
ones are diffuse, so these figures test the mechanism, they do not predict V4.1's recall.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sglang_dsv41.config import REINDEX, REUSE
from sglang_dsv41.kv.pages import entries_visible
from sglang_dsv41.layers.index_math import index_scores, topk_indices, visible_mask
from sglang_dsv41.reference.attention import SharedState
from sglang_dsv41.tools.cli import cli_parser
from sglang_dsv41.tools.recall_plot import plot_recall

DATA = Path(__file__).resolve().parents[1] / "data"


@dataclass
class QueryCapture:
    """Per layer, the captured rows: positions int64 [R] and their queries."""

    q: dict = field(default_factory=dict)  # layer -> (pos [R], q fp32 [R, H, D])
    qi: dict = field(default_factory=dict)  # layer -> (pos [R], qI fp32 [R, HI, DI], w [R, HI])


@contextmanager
def capture_queries(model, positions: torch.Tensor):
    """Wrap each global layer's `attn.query` and `attn.indexer.queries` on this model instance
    (removed on exit) to keep the rows whose position is in `positions` [R]."""
    store, wrapped = QueryCapture(), []
    for block in model.layers:
        attn = block.attn
        if attn.ratio == 0:
            continue

        def query(x, pos, _f=attn.query, _i=attn.layer_id):
            q, q_lora = _f(x, pos)
            sel = torch.isin(pos, positions)
            store.q[_i] = (pos[sel], q[sel])
            return q, q_lora

        attn.query = query
        wrapped.append((attn, "query"))
        if attn.indexer is not None:

            def queries(q_lora, x, pos, inv_freq, _f=attn.indexer.queries, _i=attn.layer_id):
                qi, w = _f(q_lora, x, pos, inv_freq)
                sel = torch.isin(pos, positions)
                store.qi[_i] = (pos[sel], qi[sel], w[sel])
                return qi, w

            attn.indexer.queries = queries
            wrapped.append((attn.indexer, "queries"))
    try:
        yield store
    finally:
        for mod, name in wrapped:
            delattr(mod, name)  # the instance attribute; the class method shows again


def _share(chosen: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per row, the share of ref's entries [R, K] (-1 padded) found in chosen [R, K2]."""
    hit = (ref[:, :, None] == chosen[:, None, :]).any(-1) & (ref >= 0)  # [R, K]
    return hit.sum(-1) / (ref >= 0).sum(-1).clamp_min(1)


def _dense_mass(q, main, pos, ratio, scale):
    """q [R, H, D], main [n, D], pos [R] -> (mass fp32 [R, n], visible bool [R, n])."""
    n = main.shape[0]
    visible = visible_mask(pos, ratio, n)  # [R, n]
    logits = torch.einsum("rhd,nd->rhn", q.float(), main.float()) * scale  # [R, H, n]
    logits = logits.masked_fill(~visible[:, None, :], float("-inf"))
    probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # rows with no entry -> 0
    return probs.mean(1), visible


def layer_metrics(model, state: SharedState, cap: QueryCapture, layer: int) -> dict:
    """Per-row metrics of one global layer for the captured rows: {name: fp32 [R]}, 'pos'."""
    cfg, attn = model.cfg, model.layers[layer].attn
    role, r = cfg.role(layer), attn.ratio
    pos, q = cap.q[layer]
    main = state.main_kv[cfg.source_layer_of(layer)]
    used = state.topk[cfg.index_source_of(layer)][pos]  # [R, TOPK]: full forward, row = pos
    mass, visible = _dense_mass(q, main, pos, r, attn.scale)
    out = {"pos": pos}
    if main.shape[0]:
        own = topk_indices(mass, visible, cfg.index_topk)
        out["attn_mass"] = (mass * _onehot(used, main.shape[0])).sum(-1)
        if role == REUSE:
            out["reuse_overlap"] = _share(used, own)
    if role == REINDEX and cfg.uses_candidates(layer):
        ipos, qi, w = cap.qi[layer]
        assert torch.equal(ipos, pos), "indexer and attention rows differ"
        k = state.index_k[cfg.source_layer_of(layer)]
        scores = index_scores(qi, w, k)  # [R, n]
        free = topk_indices(scores, visible[:, : k.shape[0]], cfg.index_topk)
        pool = state.pool_mask[pos]  # [R, n]
        kept = pool.gather(1, free.clamp_min(0)) & (free >= 0)
        out["pool_recall"] = kept.sum(-1) / (free >= 0).sum(-1).clamp_min(1)
        # the served top-k is the top-k inside the pool: it must lie in the pool
        assert bool(pool.gather(1, used.clamp_min(0))[used >= 0].all()), "top-k outside pool"
    return out


def _onehot(idx: torch.Tensor, n: int) -> torch.Tensor:
    """idx [R, K] (-1 padded) -> fp32 [R, n] with 1 at the listed entries."""
    hot = torch.zeros(idx.shape[0], n + 1)
    hot.scatter_(1, torch.where(idx >= 0, idx, torch.full_like(idx, n)), 1.0)
    return hot[:, :n]


def prompt_ids(model_dir: str, length: int, prompts: str | None) -> torch.Tensor:
    """int64 [length]: the prompt file (default: the shipped corpora) tokenized with the
    checkpoint's tokenizer, repeated to length."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    files = [Path(prompts)] if prompts else sorted(DATA.glob("corpus_*.txt"))
    ids = tok.encode("\n\n".join(f.read_text() for f in files)).ids
    if not ids:
        raise ValueError(f"--prompts {prompts}: no tokens")
    reps = -(-length // len(ids))
    return torch.tensor((ids * reps)[:length], dtype=torch.int64)


def default_contexts(cfg, max_context: int | None) -> list:
    top = min(max_context or cfg.max_position_embeddings, cfg.max_position_embeddings)
    out, c = [], 128
    while c <= top:
        out.append(c)
        c *= 2
    return out


def run(model_dir: str, contexts: list, rows: int = 16, prompts: str | None = None) -> dict:
    """The report as a dict (see the module docstring); one forward of max(contexts) tokens."""
    from sglang_dsv41.reference.model import load_reference

    model = load_reference(model_dir)
    cfg = model.cfg
    too_long = [c for c in contexts if c > cfg.max_position_embeddings]
    if too_long:
        raise ValueError(f"--contexts {too_long} exceed max_position_embeddings")
    L = max(contexts)
    ids = prompt_ids(model_dir, L, prompts)
    positions = torch.unique(
        torch.cat([torch.arange(max(c - rows, 0), c) for c in contexts])
    )  # [R_all]
    state = SharedState()
    t0 = time.time()
    with capture_queries(model, positions) as cap:
        model(ids, shared=state)
    forward_s = time.time() - t0
    global_layers = [i for i in range(cfg.num_hidden_layers) if cfg.ratio(i) > 0]
    per_layer = {i: layer_metrics(model, state, cap, i) for i in global_layers}
    pool = cfg.candidate_topk_blocks * cfg.candidate_block_size
    results = []
    for c in contexts:
        for i in global_layers:
            m = per_layer[i]
            sel = (m["pos"] >= c - rows) & (m["pos"] < c)
            n_vis = float(entries_visible(m["pos"][sel], cfg.ratio(i)).float().mean())
            row = {"context": c, "layer": i, "role": cfg.role(i), "visible_entries": n_vis}
            for name in ("pool_recall", "reuse_overlap", "attn_mass"):
                if name in m:
                    v = m[name][sel].float()
                    kept = pool if name == "pool_recall" else cfg.index_topk
                    row[name] = {
                        "mean": float(v.mean()),
                        "min": float(v.min()),
                        "chance": min(1.0, kept / n_vis),
                    }
            results.append(row)
    return {
        "model": str(model_dir),
        "geometry": {
            "index_topk": cfg.index_topk,
            "candidate_topk_blocks": cfg.candidate_topk_blocks,
            "candidate_block_size": cfg.candidate_block_size,
            "pool_positions": cfg.candidate_topk_blocks * cfg.candidate_block_size,
            "candidate_source_layer_id": cfg.candidate_source_layer_id,
            "sliding_window": cfg.sliding_window,
        },
        "layers": [
            {
                "layer": i,
                "role": cfg.role(i),
                "ratio": cfg.ratio(i),
                "kv_source": cfg.source_layer_of(i),
                "index_source": cfg.index_source_of(i),
            }
            for i in global_layers
        ],
        "contexts": list(contexts),
        "rows_per_context": rows,
        "prompts": prompts or "shipped corpora (sglang_dsv41/data/corpus_*.txt)",
        "forward_seconds": round(forward_s, 1),
        "results": results,
    }


METRICS = (
    ("pool_recall", "Reindex: share of the unrestricted top-k the candidate pool kept"),
    ("reuse_overlap", "Reuse: share of own-attention top-k inside the reused top-k"),
    ("attn_mass", "dense attention mass covered by the top-k attended"),
)


def text_table(rep: dict) -> str:
    g = rep["geometry"]
    out = [
        f"{rep['model']}: top-k {g['index_topk']}, candidate pool {g['candidate_topk_blocks']} "
        f"blocks x {g['candidate_block_size']} = {g['pool_positions']} entries (source "
        f"L{g['candidate_source_layer_id']}); mean over the last {rep['rows_per_context']} "
        f"query rows before each context; forward {rep['forward_seconds']} s"
    ]
    ctx = rep["contexts"]
    for name, title in METRICS:
        rows = [r for r in rep["results"] if name in r]
        layers = sorted({r["layer"] for r in rows})
        if not layers:
            continue
        out += ["", title, f"{'layer':>12} " + " ".join(f"{c:>7}" for c in ctx)]
        by = {(r["layer"], r["context"]): r[name]["mean"] for r in rows}
        chance = {}
        for r in rows:
            chance.setdefault(cfg_ratio(rep, r["layer"]), {})[r["context"]] = r[name]["chance"]
        for ratio, vals in sorted(chance.items()):
            label = f"chance r={ratio}"
            out.append(f"{label:>12} " + " ".join(f"{vals[c]:>7.3f}" for c in ctx))
        for i in layers:
            role = next(r["role"] for r in rows if r["layer"] == i)
            src = next(x["index_source"] for x in rep["layers"] if x["layer"] == i)
            label = f"L{i} {role}" + (f"<L{src}" if role == REUSE else "")
            out.append(f"{label:>12} " + " ".join(f"{by[(i, c)]:>7.3f}" for c in ctx))
    return "\n".join(out)


def cfg_ratio(rep: dict, layer: int) -> int:
    return next(x["ratio"] for x in rep["layers"] if x["layer"] == layer)


def main(argv=None) -> int:
    ap = cli_parser("sglang_dsv41.tools.recall_report", __doc__)
    ap.add_argument("--model", required=True, help="checkpoint directory")
    ap.add_argument("--prompts", help="text file to tokenize (default: the shipped corpora)")
    ap.add_argument("--contexts", help="comma-separated context lengths (default 128, 256, ..)")
    ap.add_argument("--max-context", type=int, help="cap for the default contexts")
    ap.add_argument("--rows", type=int, default=16, help="query rows per context (16)")
    ap.add_argument("--json", metavar="OUT", help="write the report as JSON")
    ap.add_argument("--plot", metavar="PNG", help="write the plot")
    ap.add_argument(
        "--needle",
        metavar="LENGTHS",
        help="retrieval documents of these prompt lengths instead of text: was the needle's "
        "entry in the candidate pool and the top-k (training.needle_recall)",
    )
    ap.add_argument("--per-length", type=int, default=8, help="--needle documents per length")
    args = ap.parse_args(argv)
    if args.needle:
        return needle_main(args)
    from sglang_dsv41.config import DeepseekV41Config

    cfg = DeepseekV41Config.from_hf(args.model)
    if args.contexts:
        contexts = sorted({int(c) for c in args.contexts.split(",")})
    else:
        contexts = default_contexts(cfg, args.max_context)
    if not contexts or min(contexts) < 1 or args.rows < 1:
        raise SystemExit("--contexts and --rows must be positive")
    rep = run(args.model, contexts, args.rows, args.prompts)
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1))
    if args.plot:
        plot_recall(rep, args.plot, METRICS)
    print(text_table(rep))
    return 0


def needle_main(args) -> int:
    from sglang_dsv41.training.needle_recall import format_table, needle_report, parse_lengths

    rep = needle_report(args.model, parse_lengths(args.needle, args.per_length), args.per_length)
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1))
    print(format_table(rep["table"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
