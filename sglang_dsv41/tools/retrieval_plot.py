"""retrieval_eval's PNG, drawn from its report dict alone: a heat map of accuracy over context
length (rows) and needle depth (columns), each cell labelled with its percentage."""

from __future__ import annotations


def plot_accuracy(rep: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depths = [f"{d:g}" for d in rep["depths"]]
    lengths = list(rep["accuracy"])
    grid = [[rep["accuracy"][n][d] for d in depths] for n in lengths]
    fig, ax = plt.subplots(figsize=(1.2 * len(depths) + 2.5, 0.6 * len(lengths) + 1.8))
    im = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.0%}", ha="center", va="center", fontsize=9)
    ax.set_xticks(range(len(depths)), depths)
    ax.set_yticks(range(len(lengths)), lengths)
    ax.set_xlabel("needle depth (0 = first line, 1 = last line)")
    ax.set_ylabel("prompt tokens")
    label = f" - {rep['label']}" if rep.get("label") else ""
    ax.set_title(
        f"retrieval accuracy, {rep['form']} form, {rep['facts']} facts, "
        f"{rep['per_cell']} per cell{label}",
        fontsize=9,
    )
    fig.colorbar(im, ax=ax, fraction=0.04)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
