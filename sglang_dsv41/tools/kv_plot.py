"""kv_report's PNG: drawn from `kv_capacity.capacity_report`'s dict alone (no byte math here).

Left: resident KV bytes of one request against context length, per layout. Then one panel per
GPU node: requests of that context that fit next to the weights, TP8 and DP8, per layout.
"""

from __future__ import annotations

COLORS = {"dsv41": "tab:blue", "v4": "tab:red"}
LABELS = {"dsv41": "dsv41 (V4.1 records, Hopper)", "v4": "upstream V4 584 B records"}
STYLES = {"TP8": "-", "DP8": "--"}


def _ctx_label(n: int) -> str:
    return f"{n // 1024}K" if n < 2**20 else f"{n // 2**20}M"


def plot_capacity(rep: dict, path: str, title: str = "") -> None:
    """rep: `capacity_report(...)`; writes a PNG to path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ctx = rep["contexts"]
    gpus = list(rep["gpu_bytes"])
    fig, axes = plt.subplots(1, 1 + len(gpus), figsize=(6 * (1 + len(gpus)), 5))
    ax = axes[0]
    for fp in rep["footprints"]:
        mib = [(fp["per_token"] * c + fp["per_request"]) / 2**20 for c in ctx]
        ax.plot(ctx, mib, "o-", color=COLORS[fp["layout"]], label=LABELS[fp["layout"]])
        ax.annotate(
            f"{mib[-1]:,.0f} MiB",
            (ctx[-1], mib[-1]),
            textcoords="offset points",
            xytext=(-60, 6),
            color=COLORS[fp["layout"]],
            fontsize=8,
        )
    ax.margins(y=0.2)
    ax.set_title("KV resident per request")
    ax.set_ylabel("MiB (global state + SWA window)")
    ax.legend(fontsize=8)
    for ax, gpu in zip(axes[1:], gpus, strict=True):
        for fp in rep["footprints"]:
            for dep, ls in STYLES.items():
                rows = [
                    r
                    for r in rep["rows"]
                    if r["gpu"] == gpu and r["deployment"] == dep and r["layout"] == fp["layout"]
                ]
                n = [r["requests_per_node"] for r in rows]
                ax.plot(
                    ctx,
                    [max(v, 0.5) for v in n],
                    ls,
                    marker="o",
                    color=COLORS[fp["layout"]],
                    label=f"{fp['layout']} {dep}",
                )
        r0 = next(r for r in rep["rows"] if r["gpu"] == gpu)
        budgets = {
            r["deployment"]: r["kv_budget_gib_per_gpu"] for r in rep["rows"] if r["gpu"] == gpu
        }
        ax.set_title(
            f"{gpu}: requests that fit per node\nKV budget/GPU: TP8 {budgets['TP8']:.0f} GiB,"
            f" DP8 {budgets['DP8']:.0f} GiB (weights TP8 {r0['weights_gib_per_gpu']:.0f} GiB/GPU)",
            fontsize=10,
        )
        ax.set_ylabel("concurrent requests per node (log)")
        ax.legend(fontsize=8)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ctx, [_ctx_label(c) for c in ctx])
        ax.set_xlabel("context length (tokens)")
        ax.grid(True, which="both", alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
