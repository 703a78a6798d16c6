"""recall_report's PNG, drawn from its report dict and metric titles alone: one panel per metric
against context length (log-log). A panel with up to 6 layers draws each; with more, the mean per
(role, half of the stack) with the min..max over those layers shaded. recall_report stands on this
file; this file imports nothing of it."""

from __future__ import annotations


def _series(rep: dict, name: str) -> dict:
    """label -> list of per-context means, per layer or per group of layers."""
    ctx = rep["contexts"]
    rows = [r for r in rep["results"] if name in r]
    layers = sorted({r["layer"] for r in rows})
    by = {(r["layer"], r["context"]): r[name]["mean"] for r in rows}
    if len(layers) <= 6:
        return {f"L{i} {_role(rep, i)}": ([by[(i, c)] for c in ctx], None) for i in layers}
    half = max(x["layer"] for x in rep["layers"]) // 2 + 1
    groups = {}
    for i in layers:
        part = "encoder" if i < half else "decoder"
        groups.setdefault(f"{_role(rep, i)} ({part}, {{n}} layers)", []).append(i)
    out = {}
    for label, ids in groups.items():
        vals = [[by[(i, c)] for i in ids] for c in ctx]
        mean = [sum(v) / len(v) for v in vals]
        out[label.format(n=len(ids))] = (mean, ([min(v) for v in vals], [max(v) for v in vals]))
    return out


def _ratio(rep: dict, layer: int) -> int:
    return next(x["ratio"] for x in rep["layers"] if x["layer"] == layer)


def _role(rep: dict, layer: int) -> str:
    return next(x["role"] for x in rep["layers"] if x["layer"] == layer)


def plot_recall(rep: dict, path: str, metrics) -> None:
    """Write the PNG of report `rep` to `path`; metrics: (result key, panel title) pairs, a
    panel for each key some result holds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(n, t) for n, t in metrics if any(n in r for r in rep["results"])]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.8), squeeze=False)
    ctx = rep["contexts"]
    g = rep["geometry"]
    for ax, (name, title) in zip(axes[0], panels, strict=True):
        for label, (mean, band) in _series(rep, name).items():
            (line,) = ax.plot(ctx, mean, "o-", label=label)
            if band:
                ax.fill_between(ctx, band[0], band[1], color=line.get_color(), alpha=0.15)
        for ratio in sorted({x["ratio"] for x in rep["layers"]}):
            ch = {
                r["context"]: r[name]["chance"]
                for r in rep["results"]
                if name in r and _ratio(rep, r["layer"]) == ratio
            }
            if ch:
                ax.plot(
                    ctx,
                    [ch[c] for c in ctx],
                    "--",
                    color="grey",
                    lw=1,
                    alpha=0.4 + 0.3 * (ratio == 1),
                    label=f"chance (ratio {ratio})",
                )
        if name == "pool_recall" and ctx[0] <= g["pool_positions"] <= ctx[-1]:
            ax.axvline(g["pool_positions"], color="grey", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ctx, [str(c) for c in ctx])
        ax.set_yscale("log")  # chance falls as 1 / context: log keeps both readable
        ax.set_ylim(top=1.2)
        ax.set_xlabel("context length (tokens)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"{rep['model']}: top-k {g['index_topk']}, candidate pool {g['pool_positions']} entries "
        "(dotted); random weights: compare with chance (dashed)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
