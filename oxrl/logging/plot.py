"""A PNG of the logged curves, written at the end of a run."""

from __future__ import annotations

from pathlib import Path

from oxrl.logging.metrics import read_metrics

DEFAULT_KEYS = ("loss", "val/loss", "reward/mean", "accuracy", "val/accuracy", "lr", "grad_norm", "tokens_per_s")


def plot_curves(run_dir: Path, keys: tuple[str, ...] = DEFAULT_KEYS, out_name: str = "curves.png") -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    present = [k for k in keys if any(k in r for r in records)]
    if not present:
        return None
    fig, axes = plt.subplots(len(present), 1, figsize=(7, 2.2 * len(present)), sharex=True, squeeze=False)
    for ax, key in zip(axes[:, 0], present):
        points = [(r["step"], r[key]) for r in records if key in r]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 50 else None)
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("optimizer step")
    fig.tight_layout()
    out = Path(run_dir) / out_name
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
