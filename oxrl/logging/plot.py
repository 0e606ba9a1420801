"""`curves.png`: the panels a run's metrics.jsonl supports, written at the end of a run.

Panels come from a fixed list of candidate groups (PANELS), in that order, each drawing the keys the
run logged. A series is left out when it never moves (all values equal within a relative 1e-5: e.g.
`clip_frac_high` with one update per rollout) or repeats a series already drawn (the same values at
the same steps: e.g. `accuracy` == `reward/mean` under a 0/1 reward). A panel is drawn when one of its
series has two points or more; a one-point series (a single evaluation) joins its panel's others.
Noisy training series (loss, reward) are drawn raw, thin, under their moving average.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from oxrl.logging.metrics import read_metrics


@dataclass(frozen=True)
class Panel:
    title: str
    keys: tuple[str, ...]  # fnmatch patterns, drawn in this order
    smooth: tuple[str, ...] = ()  # keys drawn raw (thin) with their moving average
    right: tuple[str, ...] = ()  # patterns drawn on a second y axis (another scale)


PANELS = (
    Panel("loss", ("loss", "val/loss"), smooth=("loss",)),
    Panel("reward (training samples)", ("reward/mean", "accuracy"), smooth=("reward/mean",)),
    Panel("held-out accuracy", ("val/accuracy", "accuracy_before", "val/reward")),
    Panel("implicit reward", ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/desirable",
                              "rewards/undesirable")),
    Panel("preference accuracy", ("rewards/accuracy", "val/rewards/accuracy")),
    Panel("response length (tokens)", ("response_length/mean", "response_length/max")),
    Panel("entropy", ("entropy",)),
    Panel("KL", ("kl_ref", "kl_ref/*", "approx_kl")),
    Panel("grad norm", ("grad_norm",)),
    Panel("learning rate", ("lr",)),
    Panel("throughput", ("tokens_per_s",), right=("completions_per_s",)),
)


@dataclass
class Series:
    key: str
    steps: list[int]
    values: list[float]
    smooth: bool = False
    right: bool = False


def series_of(records: list[dict]) -> dict[str, Series]:
    """Every logged key's finite values by step (a skipped step's NaN loss is left out)."""
    out: dict[str, Series] = {}
    for row in records:
        for key, value in row.items():
            if key in ("step", "time") or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            series = out.setdefault(key, Series(key, [], []))
            series.steps.append(int(row["step"]))
            series.values.append(float(value))
    return out


def is_constant(values: list[float], rel_tol: float = 1e-5, abs_tol: float = 1e-12) -> bool:
    return max(values) - min(values) <= abs_tol + rel_tol * max(abs(v) for v in values)


def _same(a: Series, b: Series) -> bool:
    return a.steps == b.steps and all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) for x, y in zip(a.values, b.values))


def select_panels(records: list[dict], panels: tuple[Panel, ...] = PANELS) -> list[tuple[Panel, list[Series]]]:
    """The panels to draw and their series, in PANELS order (rules in the module docstring)."""
    available = series_of(records)
    drawn: list[Series] = []
    chosen = []
    for panel in panels:
        members: list[Series] = []
        for pattern in panel.keys + panel.right:
            for key in sorted(k for k in available if fnmatchcase(k, pattern)):
                series = available.pop(key)  # a key matched by two patterns is drawn once
                if len(series.values) > 1 and is_constant(series.values):
                    continue
                if any(_same(series, other) for other in drawn + members):
                    continue
                series.smooth, series.right = key in panel.smooth, pattern in panel.right
                members.append(series)
        if any(len(s.values) > 1 for s in members):
            chosen.append((panel, members))
            drawn.extend(members)
    return chosen


def moving_average(values: list[float], window: int) -> list[float]:
    """Centred mean: point i averages values[i - h .. i + h], h = window // 2, cut at both ends (so fewer points
    there). Centred rather than trailing, so that a falling loss is not drawn late and above its raw points."""
    half = window // 2
    out = []
    for i in range(len(values)):
        around = values[max(0, i - half) : i + half + 1]
        out.append(sum(around) / len(around))
    return out


def smoothing_window(points: int) -> int | None:
    """An odd window of about a tenth of the run (3 to 51 points); None below 8 points, where smoothing hides more
    than it shows."""
    return None if points < 8 else min(51, max(3, points // 10 // 2 * 2 + 1))


def plot_curves(run_dir: Path, title: str = "", out_name: str = "curves.png") -> Path | None:
    """Write `<run_dir>/<out_name>` from its metrics.jsonl; None (and no such file) when no series moves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    records = read_metrics(run_dir)
    panels = select_panels(records)
    out = Path(run_dir) / out_name
    if not panels:
        out.unlink(missing_ok=True)  # an earlier run's figure (this directory was resumed) would mislead
        return None
    columns = 1 if len(panels) < 3 else 2
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6.4 * columns, 2.6 * rows + 0.6), squeeze=False,
                             layout="constrained")
    last_step = max(int(r["step"]) for r in records)
    for index, (ax, (panel, members)) in enumerate(zip(axes.flat, panels)):
        _draw_panel(ax, panel, members)
        ax.set_xlim(-0.02 * last_step, last_step * 1.02 + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if index + columns >= len(panels):  # the lowest panel of its column
            ax.set_xlabel("optimizer step", fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _draw_panel(ax, panel: Panel, members: list[Series]) -> None:
    # A second y axis only when both sides have a series (say tokens/s and completions/s).
    right_ax = ax.twinx() if len({s.right for s in members}) == 2 else None
    handles = []
    for colour, series in zip((f"C{i}" for i in range(10)), members):
        target = right_ax if series.right and right_ax is not None else ax
        window = smoothing_window(len(series.values)) if series.smooth else None
        if window is None:
            handles += target.plot(series.steps, series.values, color=colour, linewidth=1.4, label=series.key,
                                   marker="o" if len(series.values) <= 30 else None, markersize=3)
            continue
        target.plot(series.steps, series.values, color=colour, linewidth=0.8, alpha=0.35, label=f"{series.key} (raw)")
        handles += target.plot(series.steps, moving_average(series.values, window), color=colour, linewidth=1.8,
                               label=f"{series.key}, mean of {window} around each step")
    ax.set_title(panel.title, fontsize=10)
    ax.grid(alpha=0.3)
    for axis in filter(None, (ax, right_ax)):
        axis.tick_params(labelsize=8)
        axis.ticklabel_format(axis="y", useOffset=False, style="sci", scilimits=(-3, 4))
        axis.yaxis.get_offset_text().set_fontsize(7)
    if right_ax is not None:  # one series a side: each axis says which, in its line's colour
        for axis, line in zip((ax, right_ax), handles):
            axis.set_ylabel(line.get_label(), fontsize=8, color=line.get_color())
            axis.tick_params(axis="y", colors=line.get_color())
    elif len(handles) > 1 or members[0].smooth:
        ax.legend(fontsize=7, loc="best", framealpha=0.7)
    else:
        ax.set_ylabel(members[0].key, fontsize=8)
