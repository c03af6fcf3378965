"""Cumulative regret of the cascading bandits against the exact cascade planner
(``fedrec/ChocKaleCascade-v0``; docs/cascade.md).

    python benchmarks/cascade_regret.py                    # runs/benchmarks/cascade_regret/
    python benchmarks/cascade_regret.py --out results/cascade --overwrite   # the committed results
    python benchmarks/cascade_regret.py --steps 2000 --seeds 3 --out /tmp/cascade   # a quick look

Each policy plays one user for ``--steps`` rounds (one episode of that length, so the bandit's
rounds are the user's steps) and its **expected** per-round regret is read from the env's hidden
info: ``optimal_click_probability - slate_click_probability``, the click probability of the exact
optimal slate (:func:`fedrec.envs.cascade_model.optimal_slates`, the policy
:class:`fedrec.agents.cascade_oracle.CascadeOraclePolicy` plays) minus that of the slate played,
for the same candidates. Learners never see that info: they get the observation (candidates and
the last click) only, and learn from each round before the next (``explore_batch`` then
``learn``, as ``fedrec train`` does with one user). The candidates and click coins do not depend on
the slates, so every policy of a seed meets the same candidates (common random numbers).

Two settings of the env:

* ``fixed`` (``resample_candidates=False``): one candidate set for the whole run, the fixed items
  of Kveton et al. (2015), where CascadeUCB1's assumptions hold exactly (independent Bernoulli
  attraction per item; every candidate is its own item: ``feature_bins=10**6``);
* ``contextual`` (the registered default): a fresh candidate set every round. CascadeLinUCB's
  assumption (attraction linear in the features, Zong et al. 2016) holds approximately with
  ``phi = [1, x, x^2]`` (``degree=2``; the true attraction is a logistic of a quadratic);
  CascadeUCB1 can only pool candidates by feature bins (10 bins), so its best is a bin-level
  ranking and its regret has a linear floor.

LinUCB-slate (position-blind feedback, the same ``degree=2`` features) and random are for contrast.
Writes ``regret.json``, ``regret.md`` and ``regret.png`` into ``--out`` (an earlier run's files are
replaced only with ``--overwrite``). Results: mean cumulative regret with a 95% t-interval across
seeds, the median, and the slope of log R(t) over the second half of the run (1: linear; below 1:
sub-linear).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import fedrec  # noqa: F401  (registers the ids)
from fedrec.agents.base import SlateAgent, Transitions
from fedrec.agents.cascade_bandits import (
    CascadeLinUCBAgent,
    CascadeLinUCBConfig,
    CascadeUCB1Agent,
    CascadeUCB1Config,
)
from fedrec.agents.cascade_oracle import CascadeOraclePolicy
from fedrec.agents.linucb_slate import LinUCBSlateAgent, LinUCBSlateConfig
from fedrec.agents.reference import RandomPolicy
from fedrec.eval.stats import mean_ci
from fedrec.experiments.harness import add_out_arguments, claim_outputs, run_script, script_out

ENV_ID = "fedrec/ChocKaleCascade-v0"
SETTINGS: dict[str, dict[str, Any]] = {
    "fixed": {"resample_candidates": False},
    "contextual": {"resample_candidates": True},
}
POLICIES = ("oracle", "cascade_ucb1", "cascade_linucb", "linucb_slate", "random")
#: Points of the saved curves (log-spaced rounds) and the plotted line style of each policy.
CHECKPOINTS = 40
STYLES = {
    "oracle": ("black", ":"),
    "cascade_ucb1": ("tab:blue", "-"),
    "cascade_linucb": ("tab:green", "-"),
    "linucb_slate": ("tab:orange", "--"),
    "random": ("tab:gray", "--"),
}


def build(policy: str, setting: str, env: Any, seed: int) -> SlateAgent:
    """The policy ``policy`` for ``env`` (the configs are the module doc's)."""
    if policy == "oracle":
        return CascadeOraclePolicy(slate_size=env.single_action_space.slate_size, seed=seed)
    if policy == "random":
        return RandomPolicy(slate_size=env.single_action_space.slate_size, seed=seed)
    if policy == "cascade_ucb1":
        bins = 10**6 if setting == "fixed" else 10
        config = CascadeUCB1Config(feature_bins=bins)
        return CascadeUCB1Agent.from_env(env, config=config, seed=seed)
    if policy == "cascade_linucb":
        return CascadeLinUCBAgent.from_env(env, config=CascadeLinUCBConfig(degree=2), seed=seed)
    if policy == "linucb_slate":
        return LinUCBSlateAgent.from_env(env, config=LinUCBSlateConfig(degree=2), seed=seed)
    raise ValueError(f"unknown policy {policy!r}; known: {POLICIES}")


def regret_curve(
    policy: str, setting: str, seed: int, steps: int, *, env_kwargs: dict[str, Any] | None = None
) -> np.ndarray:
    """Per-round expected regret (``steps``,) of ``policy`` for one user of ``setting``.

    Round t: the policy serves a slate for the current candidates (the oracle reads the hidden
    attraction, the others the observation only), the env reports the click probabilities of the
    optimal and of the played slate, and a learner learns from the round.
    """
    kwargs = {**SETTINGS[setting], "time_budget": steps, **(env_kwargs or {})}
    env = gym.make_vec(ENV_ID, num_envs=1, **kwargs)
    agent = build(policy, setting, env, seed)
    observation, info = env.reset(seed=seed)
    regret = np.empty(steps)
    for t in range(steps):
        if agent.oracle:
            slates = agent.act_batch(observation, infos=info)
        else:
            slates = agent.explore_batch(observation)
        next_observation, rewards, terminated, truncated, info = env.step(slates)
        regret[t] = info["optimal_click_probability"][0] - info["slate_click_probability"][0]
        agent.learn(
            Transitions(observation, slates, rewards, next_observation, terminated, truncated)
        )
        observation = next_observation
    env.close()
    return regret


def late_slope(cumulative: np.ndarray) -> float:
    """Slope of log R(t) against log t over the second half of the rounds (1 for linear regret,
    below 1 for sub-linear; NaN where R is 0, e.g. the oracle)."""
    t = np.arange(1, len(cumulative) + 1)
    half = slice(len(cumulative) // 2, None)
    if np.any(cumulative[half] <= 0):
        return float("nan")
    return float(np.polyfit(np.log(t[half]), np.log(cumulative[half]), 1)[0])


def summarise(curves: np.ndarray) -> dict[str, Any]:
    """Mean, 95% CI half-width and median of the cumulative regret (seeds x steps) at
    log-spaced rounds, and the final regret and late slope of every seed."""
    steps = curves.shape[1]
    rounds = np.unique(np.geomspace(1, steps, CHECKPOINTS).round().astype(int))
    cumulative = np.cumsum(curves, axis=1)
    points = cumulative[:, rounds - 1]
    mean_half = [mean_ci(points[:, i], 0.95) for i in range(len(rounds))]
    slopes = [late_slope(c) for c in cumulative]
    finite = [s for s in slopes if np.isfinite(s)]
    slope_mean, slope_half = mean_ci(np.asarray(finite), 0.95) if finite else (np.nan, np.nan)
    return {
        "rounds": rounds.tolist(),
        "mean": [round(float(m), 4) for m, _ in mean_half],
        "ci95": [round(float(h), 4) if np.isfinite(h) else None for _, h in mean_half],
        "median": [round(float(v), 4) for v in np.median(points, axis=0)],
        "final_per_seed": [round(float(v), 4) for v in cumulative[:, -1]],
        "late_slope_per_seed": [round(s, 4) if np.isfinite(s) else None for s in slopes],
        "late_slope_mean": None if not np.isfinite(slope_mean) else round(float(slope_mean), 4),
        "late_slope_ci95": None if not np.isfinite(slope_half) else round(float(slope_half), 4),
    }


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(results["curves"])
    fig, axes = plt.subplots(1, len(settings), figsize=(6 * len(settings), 4.5), squeeze=False)
    floor = 0.1  # log axes: the band's lower edge is clipped here (the oracle's 0 is in the title)
    for ax, setting in zip(axes[0], settings, strict=True):
        steps = results["meta"]["steps"]
        ax.plot([1, steps], [floor, floor * steps], ":", color="black", lw=0.8, label="∝ t")
        for policy, summary in results["curves"][setting].items():
            if policy == "oracle":
                continue
            color, style = STYLES[policy]
            rounds = np.asarray(summary["rounds"])
            mean = np.asarray(summary["mean"])
            half = np.asarray([h if h is not None else 0.0 for h in summary["ci95"]])
            median = np.asarray(summary["median"])
            slope = summary["late_slope_mean"]
            label = policy if slope is None else f"{policy} (late slope {slope:.2f})"
            ax.plot(rounds, mean, style, color=color, label=label)
            ax.plot(rounds, median, ".", color=color, ms=3)
            low = np.maximum(mean - half, floor)
            ax.fill_between(rounds, low, np.maximum(mean + half, floor), color=color, alpha=0.2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(bottom=floor)
        ax.set_xlabel("round t (one user step)")
        ax.set_ylabel("cumulative expected regret R(t)")
        what = (
            "fixed items (Kveton et al.)"
            if setting == "fixed"
            else "fresh candidates each round (the registered env)"
        )
        ax.set_title(f"{setting}: {what}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    meta = results["meta"]
    zero = all(
        max(policies["oracle"]["final_per_seed"]) == 0.0
        for policies in results["curves"].values()
        if "oracle" in policies
    )
    fig.suptitle(
        f"{ENV_ID}: regret vs the exact planner; lines: mean, band: 95% CI, dots: median "
        f"({meta['seeds']} seeds)" + ("; the planner itself: 0" if zero else ""),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def table_markdown(results: dict[str, Any]) -> str:
    lines = [
        "| setting | policy | R(T/2) | R(T) | late slope of log R(t) |",
        "|---|---|---:|---:|---:|",
    ]
    for setting, policies in results["curves"].items():
        for policy, summary in policies.items():
            finals = np.asarray(summary["final_per_seed"])
            cumulative_half = _value_at(summary, results["meta"]["steps"] // 2)
            mean, half = mean_ci(finals, 0.95)
            slope = summary["late_slope_mean"]
            slope_half = summary["late_slope_ci95"]  # None with one seed: no interval
            slope_text = "-" if slope is None else f"{slope:.2f}"
            if slope is not None and slope_half is not None:
                slope_text += f" ± {slope_half:.2f}"
            regret = f"{mean:.1f}" + (f" ± {half:.1f}" if np.isfinite(half) else " (one seed)")
            lines.append(
                f"| {setting} | {policy} | {cumulative_half:.1f} | {regret} | {slope_text} |"
            )
    meta = results["meta"]
    return (
        "\n".join(lines)
        + f"\n\nT = {meta['steps']:,} rounds, {meta['seeds']} seeds; R is the cumulative expected "
        "regret (mean ± 95% t-interval across seeds at T; the mean at T/2); the late slope is "
        "that of log R(t) against log t over the second half (1: linear).\n"
    )


def _value_at(summary: dict[str, Any], step: int) -> float:
    """The mean cumulative regret at the saved round nearest ``step`` (log-spaced rounds)."""
    rounds = np.asarray(summary["rounds"])
    return float(np.interp(np.log(step), np.log(rounds), np.asarray(summary["mean"])))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="rounds per run (T)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    add_out_arguments(parser, "cascade_regret", what="folder of regret.json, .md and .png")
    parser.add_argument(
        "--replot", action="store_true", help="redraw regret.png and regret.md from regret.json"
    )
    args = parser.parse_args(argv)
    args.out = script_out("cascade_regret", args.out)
    if not args.replot and (args.steps < 4 or args.seeds < 1):
        parser.error("need --steps >= 4 and --seeds >= 1")
    written = [] if args.replot else [args.out / "regret.json"]
    written += [args.out / "regret.md", args.out / "regret.png"]
    claim_outputs(written, overwrite=args.overwrite)
    if args.replot:
        results = json.loads((args.out / "regret.json").read_text())
        (args.out / "regret.md").write_text(table_markdown(results))
        plot(results, args.out / "regret.png")
        return 0
    start = time.perf_counter()
    curves: dict[str, dict[str, Any]] = {}
    for setting in args.settings:
        curves[setting] = {}
        for policy in args.policies:
            tic = time.perf_counter()
            runs = np.stack(
                [regret_curve(policy, setting, seed, args.steps) for seed in range(args.seeds)]
            )
            curves[setting][policy] = summarise(runs)
            print(
                f"{setting} {policy}: R(T) = {np.mean(runs.sum(axis=1)):.1f} "
                f"({time.perf_counter() - tic:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    results = {
        "meta": {
            "env": ENV_ID,
            "steps": args.steps,
            "seeds": args.seeds,
            "settings": {name: SETTINGS[name] for name in args.settings},
            "seconds": round(time.perf_counter() - start, 1),
            "command": "python benchmarks/cascade_regret.py " + " ".join(argv or sys.argv[1:]),
        },
        "curves": curves,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "regret.json").write_text(json.dumps(results, indent=1) + "\n")
    markdown = table_markdown(results)
    (args.out / "regret.md").write_text(markdown)
    plot(results, args.out / "regret.png")
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
