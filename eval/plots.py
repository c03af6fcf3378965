"""Learning-curve plots of aggregated training runs (matplotlib, Agg backend, PNG).

One subplot per return series (``return``, or ``return/<platform>`` and the joint return
``return/joint`` for multi-platform runs; the platforms share a y axis, the joint has its own);
each group of runs is one mean curve over seeds with a band (95% t-interval with >= 3 seeds,
min–max with 2, none with 1; the legend says which), and dashed horizontal lines at the random
and planner policies' held-out means when ``final_eval.json`` reported them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from fedrec.eval.etror import JOINT_SERIES, GroupSummary

#: Line styles of the reference lines (both dashed; the planner's is the denser).
REFERENCE_STYLES = {"planner": (0, (5, 2)), "random": (0, (2, 3))}


def plot_learning_curves(
    groups: Sequence[GroupSummary],
    path: str | Path,
    *,
    title: str | None = None,
    window: int | None = None,
    log_episodes: bool = False,
) -> Path:
    """Overlay the groups' mean learning curves, one subplot per return series; write a PNG.

    ``window`` (the moving-average length) only labels the y axis; ``log_episodes`` puts the
    episodes on a log scale (for groups whose budgets differ by orders of magnitude). Returns the
    written path.
    """
    series = list(dict.fromkeys(name for group in groups for name in group.series))
    if not series:
        raise ValueError("nothing to plot: no run has a return column")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(1, len(series), figsize=(6.4 * len(series), 4.4), squeeze=False)
    # One y axis for the per-platform series; the joint return (their sum) is on another scale.
    shared = [ax for ax, name in zip(axes[0], series, strict=True) if name != JOINT_SERIES]
    for ax in shared[1:]:
        ax.sharey(shared[0])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    try:
        for ax, name in zip(axes[0], series, strict=True):
            drawn_references: set[tuple[str, float]] = set()
            for index, group in enumerate(groups):
                summary = group.series.get(name)
                if summary is None:
                    continue
                color = colors[index % len(colors)]
                label = f"{group.label} (n={summary.seeds}"
                label += f", band: {summary.band})" if summary.band != "none" else ")"
                ax.plot(summary.curve_episodes, summary.curve_mean, color=color, label=label)
                if summary.band != "none":
                    ax.fill_between(
                        summary.curve_episodes,
                        summary.curve_low,
                        summary.curve_high,
                        color=color,
                        alpha=0.2,
                        linewidth=0,
                    )
                for policy, style in REFERENCE_STYLES.items():
                    estimate = summary.references.get(policy)
                    if estimate is None or math.isnan(estimate.mean):
                        continue
                    key = (policy, round(estimate.mean, 1))
                    if key in drawn_references:  # same reference for several groups: draw once
                        continue
                    drawn_references.add(key)
                    ax.axhline(
                        estimate.mean,
                        color=color if len(groups) > 1 else "black",
                        linestyle=style,
                        linewidth=1.0,
                        label=f"{policy} {estimate.mean:.1f}"
                        + (f" ({group.label})" if len(groups) > 1 else ""),
                    )
            ax.set_title(name)
            ax.set_xlabel("episode" + (" (log scale)" if log_episodes else ""))
            plotted = [g.series[name].curve_episodes for g in groups if name in g.series]
            if log_episodes and any((episodes > 0).any() for episodes in plotted):
                ax.set_xscale("log")  # (a run shorter than the window has no curve to scale)
            ax.grid(alpha=0.3)
            # Below the axes: with several groups an in-plot legend hides the curves.
            ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1)
        ylabel = "return" + (f" (mean of last {window} episodes)" if window else "")
        axes[0][0].set_ylabel(ylabel)
        for ax, name in zip(axes[0], series, strict=True):
            if name == JOINT_SERIES:
                ax.set_ylabel("joint " + ylabel)
        figure.suptitle(title or "Learning curves (mean over seeds)")
        figure.tight_layout()
        figure.savefig(path, dpi=110, bbox_inches="tight")
    finally:
        plt.close(figure)
    return path
