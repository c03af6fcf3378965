"""``fedrec bench zoo``'s tables: the leaderboard rows (:func:`build_rows`), the Markdown
leaderboard, the headline table, and the CSV and JSON beside them."""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedrec.experiments import harness
from fedrec.experiments.zoo_config import ENVS, NO_LEARNING, NUM_ENVS, REFERENCES, ZooConfig
from fedrec.experiments.zoo_speed import SPEED_ENV


@dataclasses.dataclass(frozen=True)
class Row:
    """One policy on one env, over seeds."""

    env: str
    policy: str
    kind: str
    """``learner``, ``reference`` or ``oracle``"""
    seeds: int
    mean: float
    half_width: float
    over_best: tuple[float, float] | None
    """(mean, half-width) of this - the best no-learning policy, paired per seed"""
    best: str | None
    """the best no-learning policy of the env"""
    train_seconds: float | None
    steps_per_second: float | None
    eval_seconds: float
    skipped: str | None = None

    @property
    def verdict(self) -> str:
        """Whether a learner beats the best no-learning policy (95% interval of the paired
        difference above 0), ties it or loses."""
        if self.over_best is None or self.kind != "learner":
            return ""
        mean, half = self.over_best
        if not math.isfinite(half):
            return "beats" if mean > 0 else "below"
        if mean - half > 0:
            return "beats"
        if mean + half < 0:
            return "below"
        return "tie"


def _t(values: Sequence[float]) -> tuple[float, float]:
    return harness.mean_ci(values)


def build_rows(config: ZooConfig, records: Mapping[str, Any]) -> list[Row]:
    """The leaderboard rows, env by env: learners and references, best mean first, skipped rows
    last. ``records``: env -> {"agents": {agent: [record per seed]}, "references": [record per
    seed]}."""
    rows: list[Row] = []
    for env in config.env_list:
        refs = records[env]["references"]
        per_seed: dict[str, list[dict[str, Any]]] = {}
        for name in REFERENCES:
            per_seed[name] = [r["policies"][name] for r in refs]
        for agent in config.agents:
            per_seed[agent] = records[env]["agents"][agent]
        means = {
            name: [r["mean"] for r in entries]
            for name, entries in per_seed.items()
            if not any("skipped" in r for r in entries)
        }
        heuristics = [h for h in NO_LEARNING if h in means]
        best = max(heuristics, key=lambda h: statistics.fmean(means[h]), default=None)
        env_rows = []
        for name, entries in per_seed.items():
            kind = "learner" if name in config.agents else "reference"
            if kind == "reference" and REFERENCES[name][0]:
                kind = "oracle"
            if name not in means:
                reason = next(r["skipped"] for r in entries if "skipped" in r)
                env_rows.append(
                    Row(env, name, kind, 0, math.nan, math.nan, None, best, None, None, 0.0,
                        reason)
                )  # fmt: skip
                continue
            mean, half = _t(means[name])
            over = None
            if best is not None and name != best:
                over = _t([a - b for a, b in zip(means[name], means[best], strict=True)])
            train = [r["train_seconds"] for r in entries if "train_seconds" in r]
            rate = [r["steps_per_second"] for r in entries if "steps_per_second" in r]
            env_rows.append(
                Row(
                    env, name, kind, len(entries), mean, half, over, best,
                    statistics.fmean(train) if train else None,
                    statistics.median(rate) if rate else None,
                    statistics.fmean(r["eval_seconds"] for r in entries),
                )
            )  # fmt: skip
        env_rows.sort(key=lambda r: (r.skipped is not None, -r.mean if r.skipped is None else 0))
        rows += env_rows
    return rows


COLUMNS = [
    "env", "rank", "policy", "kind", "seeds", "mean return", "vs best no-learning", "verdict",
    "train s/run", "env steps/s", "eval s/run", "note",
]  # fmt: skip


def _pm(mean: float, half: float, *, sign: bool = False) -> str:
    text = f"{mean:+.1f}" if sign else f"{mean:.1f}"
    return text if not math.isfinite(half) else f"{text} ± {half:.1f}"


def row_cells(rank: int | None, row: Row) -> list[str]:
    note = f"skipped: {row.skipped}" if row.skipped else ""
    if row.kind == "oracle" and not row.skipped:
        note = "oracle reference (reads the hidden user)"
    if row.policy == row.best:
        note = "best no-learning policy"
    return [
        row.env,
        "" if rank is None else str(rank),
        row.policy,
        row.kind,
        str(row.seeds),
        "" if row.skipped else _pm(row.mean, row.half_width),
        "" if row.over_best is None else _pm(*row.over_best, sign=True),
        row.verdict,
        "" if row.train_seconds is None else f"{row.train_seconds:.1f}",
        "" if row.steps_per_second is None else f"{row.steps_per_second:,.0f}",
        "" if row.skipped else f"{row.eval_seconds:.2f}",
        note,
    ]


def render(config: ZooConfig, rows: Sequence[Row], speed: Mapping[str, Any] | None) -> str:
    """The whole leaderboard as Markdown: one table per env, then the throughput ratios."""
    lines = [
        "# fedrec bench zoo",
        "",
        "Mean greedy return on the env's held-out episodes (the same for every policy of a "
        f"seed), mean ± 95% t-interval over {config.seeds} seeds; 'vs best no-learning' is paired per seed on the "
        "same episodes; 'beats' when its interval is above 0. Learners trained with "
        f"{NUM_ENVS} users in parallel for the env's budget of env steps.",
    ]
    for env in config.env_list:
        spec = ENVS[env]
        lines += [
            "",
            f"## {env}: {spec.title}",
            "",
            f"`{spec.env_id}`, {config.budget(env):,} training env steps per run, "
            f"{config.eval_budget(env)} held-out episodes per seed.",
            "",
            "| " + " | ".join(COLUMNS[1:]) + " |",
            "|" + "---|" * (len(COLUMNS) - 1),
        ]
        rank = 0
        for row in (r for r in rows if r.env == env):
            rank += row.skipped is None
            cells = row_cells(None if row.skipped else rank, row)[1:]
            lines.append("| " + " | ".join(cells) + " |")
    if speed:
        lines += [
            "",
            "## Training throughput against Stable-Baselines3",
            "",
            f"`{SPEED_ENV}`, {config.speed_steps:,} transitions of {NUM_ENVS} users per run, "
            f"median of {config.speed_runs} alternating runs.",
            "",
            "| fedrec agent | env steps/s | outside | env steps/s | ratio |",
            "|---|---|---|---|---|",
        ]
        for agent, pair in speed.items():
            ours = statistics.median(pair["fedrec_steps_per_second"])
            theirs = statistics.median(pair["outside_steps_per_second"])
            lines.append(
                f"| {agent} | {ours:,.0f} | {pair['outside']} | {theirs:,.0f} | "
                f"{pair['ratio']:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def headline(config: ZooConfig, rows: Sequence[Row]) -> str:
    """The short table: learners and the main references (rows) by env (columns), mean ± CI;
    a learner's cell is bold where it beats the best no-learning policy."""
    envs = list(config.env_list)
    names = [*config.agents, "random", "best no-learning", "planner (oracle)"]
    table = {(r.env, r.policy): r for r in rows}
    lines = ["| policy | " + " | ".join(envs) + " |", "|---|" + "---|" * len(envs)]
    for name in names:
        cells = []
        for env in envs:
            if name == "best no-learning":
                best = next((r.best for r in rows if r.env == env), None)
                row = table.get((env, best)) if best else None
            else:
                row = table.get((env, name.split(" ")[0]))
            if row is None or row.skipped:
                cells.append("n/a")
                continue
            text = _pm(row.mean, row.half_width)
            if name == "best no-learning":
                text += f" ({row.policy})"
            if row.verdict == "beats":
                text = f"**{text}**"
            cells.append(text)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(
    out: Path, config: ZooConfig, rows: Sequence[Row], speed: Mapping[str, Any] | None
) -> str:
    """Write the tables (Markdown, CSV, JSON); returns the Markdown."""
    markdown = render(config, rows, speed)
    (out / "leaderboard.md").write_text(markdown, encoding="utf-8")
    (out / "headline.md").write_text(headline(config, rows), encoding="utf-8")
    with (out / "leaderboard.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for env in config.env_list:
            rank = 0
            for row in (r for r in rows if r.env == env):
                rank += row.skipped is None
                writer.writerow(row_cells(None if row.skipped else rank, row))
    harness.write_json(
        out / "leaderboard.json",
        {"config": config.key(), "rows": [dataclasses.asdict(r) for r in rows], "speed": speed},
    )
    return markdown
