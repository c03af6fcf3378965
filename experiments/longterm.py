"""``fedrec bench longterm``: the leaderboard of the settings where planning matters.

For each setting (``fedrec/ChocKaleLongTerm-v0`` at (N, n) = (10, 3) and (100, 10), and
``fedrec/ChocKaleUserTypes-v0``, whose users differ in a hidden sensitivity) it trains every
contender (SlateQ variants, the rule searches, PPO and recurrent PPO) for ``--seeds`` seeds with
fedrec's training loop, each run in ``OUT/SETTING/CONTENDER/seedS``, and ranks them with the
reference policies (random, the two fixed heuristics, and the oracles myopic and planner, which
read the user's hidden state) on the same held-out episodes: the final greedy return, the regret
to the planner and the gain over the best fixed heuristic (both paired per seed), with 95%
t-intervals across seeds, and the training time. A finished run whose ``config.json`` matches is
read, not retrained, and a killed one is resumed, so the command can be run again to complete a
leaderboard. Writes ``leaderboard.md`` / ``leaderboard.csv`` and ``learning_curves.png`` per
setting.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedrec.experiments import harness
from fedrec.experiments.harness import option

if TYPE_CHECKING:  # fedrec.eval.etror loads pandas and SciPy: imported where used
    from fedrec.eval.etror import Estimate


@dataclasses.dataclass(frozen=True)
class Setting:
    """A registered env and its keyword arguments."""

    env_id: str
    env_kwargs: Mapping[str, Any]
    title: str


SETTINGS: dict[str, Setting] = {
    "10x3": Setting("fedrec/ChocKaleLongTerm-v0", {}, "ChocKaleLongTerm-v0, (N, n) = (10, 3)"),
    "100x10": Setting(
        "fedrec/ChocKaleLongTerm-v0",
        {"num_candidates": 100, "slate_size": 10},
        "ChocKaleLongTerm-v0, (N, n) = (100, 10)",
    ),
    "user-types": Setting(
        "fedrec/ChocKaleUserTypes-v0",
        {},
        "ChocKaleUserTypes-v0, (N, n) = (10, 3): hidden user types (tau 0 or 0.1)",
    ),
}


@dataclasses.dataclass(frozen=True)
class Contender:
    """A learning agent of the leaderboard: a registered agent, its overrides and its budget."""

    agent: str
    episodes: int
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    description: str = ""
    #: the settings it runs on by default (None: every setting; (): only when named)
    settings: tuple[str, ...] | None = None


CONTENDERS: dict[str, Contender] = {
    "slateq": Contender("slateq", 3000, {}, "SlateQ, gamma 0.9, the observation as its state"),
    "slateq_myopic": Contender("slateq", 3000, {"gamma": 0.0}, "SlateQ with gamma 0 (myopic)"),
    "slateq_memory": Contender(
        "slateq", 3000, {"memory_decay": 0.9}, "SlateQ, gamma 0.9, with its consumption memory"
    ),
    "rule_search": Contender(
        "rule_search", 20000, {}, "cross-entropy search over a (feature, time) slate rule"
    ),
    "rule_search_adaptive": Contender(
        "rule_search_adaptive",
        100000,
        {},
        "rule_search whose rule also reads the observed satisfaction level",
    ),
    "rule_search_adaptive_long": Contender(
        "rule_search_adaptive",
        300000,
        {},
        "rule_search_adaptive with three times the budget (its search is still narrowing at "
        "100,000 episodes)",
        settings=("user-types",),
    ),
    # Run only when named (--agents rule_search_adaptive_xl --settings user-types): six times the
    # budget gained 1.2 over rule_search_adaptive_long (the search's spread ends at its floor),
    # so its runs are not in results/longterm (docs/longterm.md, "Closing in").
    "rule_search_adaptive_xl": Contender(
        "rule_search_adaptive",
        600000,
        {},
        "rule_search_adaptive with six times the budget (measured in docs/longterm.md, not on "
        "the committed leaderboard)",
        settings=(),
    ),
    "rule_search_sequential": Contender(
        "rule_search_sequential",
        150000,
        {},
        "cross-entropy search over a rule with a sequential test of whether the user's observed "
        "satisfaction responds (8 numbers)",
        settings=("user-types",),
    ),
    # The same search with each rule scored on 64 user-episodes instead of 16 (and four times
    # the budget, so as many updates): the seeds' searches end at the same rule
    # (docs/longterm.md, "Closing in").
    "rule_search_sequential_long": Contender(
        "rule_search_sequential",
        600000,
        {"episodes_per_rule": 64},
        "rule_search_sequential with each rule scored on 64 user-episodes (600,000 episodes)",
        settings=("user-types",),
    ),
    # Measured in docs/longterm.md ("Closing in"): its searches end 8 to 29 below the belief
    # planner from seed to seed, so its runs are not in results/longterm; runs only when named.
    "rule_search_evidence": Contender(
        "rule_search_evidence",
        600000,
        {"episodes_per_rule": 64},
        "cross-entropy search over a rule that weighs the evidence that the user's observed "
        "satisfaction follows what was served (8 numbers; each rule scored on 64 user-episodes)",
        settings=(),
    ),
    # The readings' model fitted from the agent's observations, the decision searched (5 numbers
    # with a control variate in the scores; docs/longterm.md, "Closing in").
    "rule_search_fitted": Contender(
        "rule_search_fitted",
        600000,
        {"episodes_per_rule": 64},
        "cross-entropy search over a decision on the posterior of a readings' model fitted to "
        "the agent's own observations (5 numbers; each rule scored on 64 user-episodes)",
        settings=("user-types",),
    ),
    "ppo": Contender("ppo", 3000, {}, "Stable-Baselines3 PPO (scores per candidate)"),
    "recurrent_ppo": Contender("recurrent_ppo", 3000, {}, "sb3-contrib recurrent PPO (LSTM)"),
}

#: Reference policies of every leaderboard: name -> (oracle: reads the hidden state or knows the
#: model's user, description).
REFERENCES: dict[str, tuple[bool, str]] = {
    "planner": (True, "optimal planner (DP over the true exposure, each user's tau)"),
    "belief_planner": (
        True,
        "knows the model, not the user: QMDP on the exact posterior over (type, exposure)",
    ),
    "myopic": (True, "myopic oracle (best expected engagement now)"),
    "best_open_loop": (
        False,
        "the best schedule of fixed rules by step, searched with the model (no feedback)",
    ),
    "top_x": (False, "fixed heuristic: the n largest-feature candidates"),
    "bottom_x": (False, "fixed heuristic: the n smallest-feature candidates"),
    "random": (False, "uniformly random slates"),
}
#: The no-learning policies (no feedback, no hidden state): a learning claim is over the best.
NO_LEARNING = ("top_x", "bottom_x", "best_open_loop")
COLUMNS = [
    "rank",
    "policy",
    "oracle",
    "seeds",
    "final greedy return",
    "regret to planner",
    "regret %",
    "vs best no-learning",
    "vs belief planner",
    "vs random",
    "train s/run",
    "episodes",
]


# --------------------------------------------------------------------------------- training


def _expected_config(
    setting: Setting, contender: Contender, agent_config: Any, seed: int, episodes: int
) -> dict[str, Any]:
    """The setup entries of the run's ``config.json``, as the training loop writes them."""
    from fedrec.agents.registry import json_ready

    return {
        "agent": contender.agent,
        "env_id": setting.env_id,
        "env_kwargs": json_ready(dict(setting.env_kwargs)),
        "episodes": episodes,
        "seed": seed,
        "agent_config": json_ready(dataclasses.asdict(agent_config)),
    }


def _run_state(path: Path, expected: Mapping[str, Any], defaults: Mapping[str, Any]) -> str:
    """``"new"``, ``"finished"`` (a matching run with its final evaluation) or ``"killed"``.

    A run saved before one of the agent's hyperparameters existed matches when the expected
    value is that hyperparameter's default (the old behaviour), as on ``--resume``.
    """
    config_path = path / "config.json"
    if not config_path.exists():
        return "new"
    saved = harness.read_cached(config_path, harness.record({}), "run configuration")
    if isinstance(saved.get("agent_config"), dict):
        saved["agent_config"] = {**defaults, **saved["agent_config"]}
    differ = [key for key, value in expected.items() if saved.get(key) != value]
    if differ:
        raise ValueError(
            f"{path} holds another run ({', '.join(differ)} differ from this leaderboard's): "
            "move it away or use another --out"
        )
    from fedrec.eval.etror import run_file

    final = run_file(path, "final_eval.json")  # gzipped in a compacted run
    if not final.exists():
        return "killed"
    harness.read_cached(final, FINAL_EVAL, "final evaluation")
    return "finished"


#: What the leaderboard reads of a finished run's ``final_eval.json``: the agent's per-episode
#: returns, all finite.
FINAL_EVAL = harness.record(
    {
        "policies": harness.record(
            {"agent": harness.record({"returns": harness.list_of(harness.finite, min_length=1)})}
        )
    }
)


def train_contender(
    setting_name: str,
    contender_name: str,
    *,
    seed: int,
    out: Path,
    episodes: int | None = None,
    eval_episodes: int = 500,
    progress: bool = True,
    log: Any = print,
) -> Path:
    """Train (or read, or resume) one contender's run for one seed; returns its directory."""
    from fedrec.agents.registry import json_ready, make_config, resolve_agent
    from fedrec.train.loop import TrainConfig, train

    setting, contender = SETTINGS[setting_name], CONTENDERS[contender_name]
    episodes = episodes or contender.episodes
    path = out / setting_name / contender_name / f"seed{seed}"
    agent_cls = resolve_agent(contender.agent)
    agent_config = make_config(agent_cls, contender.overrides)
    defaults = json_ready(dataclasses.asdict(agent_cls.Config()))
    expected = _expected_config(setting, contender, agent_config, seed, episodes)
    state = _run_state(path, expected, defaults)
    if state == "finished":
        log(f"{setting_name} {contender_name} seed {seed}: finished run in {path}, read")
        return path
    config = TrainConfig(
        env_id=setting.env_id,
        episodes=episodes,
        seed=seed,
        env_kwargs=dict(setting.env_kwargs),
        eval_episodes=eval_episodes,
        progress=progress,
    )
    result = train(
        lambda env: agent_cls.from_env(env, config=agent_config, seed=seed),
        config=config,
        out_dir=path,
        resume=state == "killed",
        run_info={"agent": contender.agent},
    )
    log(
        f"{setting_name} {contender_name} seed {seed}: {episodes} episodes in "
        f"{result.wall_time:.1f} s -> {path}"
    )
    return path


# --------------------------------------------------------------------------------- leaderboard


@dataclasses.dataclass(frozen=True)
class Row:
    """One policy of a leaderboard, over seeds."""

    policy: str
    oracle: bool
    seeds: int
    final: Estimate
    regret: Estimate | None
    regret_percent: float
    over_best_no_learning: Estimate | None
    #: this - belief_planner, paired (hidden user types: the ceiling without knowing the type)
    over_belief_planner: Estimate | None
    over_random: Estimate | None
    train_seconds: float | None = None
    episodes: int | None = None


def _paired(tables: Sequence[Mapping[str, np.ndarray]], a: str, b: str) -> Estimate | None:
    from fedrec.eval.etror import t_interval

    """Mean of (a - b) on the same held-out episodes: per seed, then a t-interval across seeds
    (one seed: across its episodes)."""
    tables = [t for t in tables if a in t and b in t]
    if not tables:
        return None
    if len(tables) == 1:
        return t_interval(tables[0][a] - tables[0][b])
    return t_interval([float(np.mean(t[a] - t[b])) for t in tables])


def leaderboard(runs: Mapping[str, Sequence[Path]]) -> list[Row]:
    """Rows for the contenders' runs (name -> run directories, one per seed) and the reference
    policies, best final return first. References come from the runs' final evaluations (with
    any ``references.json`` added later on the same episodes): every run of a seed is evaluated
    on the same held-out episodes (checked)."""
    from fedrec.eval.etror import load_run, t_interval

    references: dict[int, dict[str, np.ndarray]] = {}  # seed -> reference policy -> returns
    contenders: dict[str, list[tuple[int, np.ndarray]]] = {}  # name -> (seed, returns)
    details: dict[str, tuple[float | None, int | None]] = {}  # name -> (train s/run, episodes)
    for name, paths in runs.items():
        logs = [load_run(path) for path in paths]
        if not logs:
            continue
        contenders[name] = []
        for log in logs:
            final = log.final("return")
            if final.agent is None or final.agent.returns is None:
                raise ValueError(f"{log.path} has no final evaluation with per-episode returns")
            seed = int(log.seed or 0)
            contenders[name].append((seed, final.agent.returns))
            known = references.setdefault(seed, {})
            for key, ref in final.references.items():
                if ref.returns is None:
                    continue
                if key in known and not np.array_equal(known[key], ref.returns):
                    raise ValueError(
                        f"{log.path}: {key} differs from another run of seed {seed}: the runs "
                        "were not evaluated on the same held-out episodes"
                    )
                known[key] = ref.returns
        times = [(log.final_eval or {}).get("train_wall_time_s") for log in logs]
        times = [t for t in times if t is not None]
        episodes = logs[0].config.get("episodes")
        details[name] = (float(np.mean(times)) if times else None, episodes)
    seeds = sorted(references)
    heuristics = [h for h in NO_LEARNING if all(h in references[s] for s in seeds)]
    best = max(
        heuristics, key=lambda h: np.mean([references[s][h].mean() for s in seeds]), default=None
    )

    def summarise(policy: str, oracle: bool, per_seed: list[tuple[int, np.ndarray]]) -> Row:
        tables = [{**references[seed], "this": returns} for seed, returns in per_seed]
        means = [float(returns.mean()) for _, returns in per_seed]
        final = t_interval(means) if len(means) > 1 else t_interval(per_seed[0][1])
        regret = _paired(tables, "planner", "this") if policy != "planner" else None
        planner = [t["planner"].mean() for t in tables if "planner" in t]
        train_seconds, episodes = details.get(policy, (None, None))
        return Row(
            policy=policy,
            oracle=oracle,
            seeds=len(per_seed),
            final=final,
            regret=regret,
            regret_percent=100 * regret.mean / np.mean(planner) if regret and planner else math.nan,
            over_best_no_learning=_paired(tables, "this", best)
            if best not in (None, policy)
            else None,
            over_belief_planner=_paired(tables, "this", "belief_planner")
            if policy != "belief_planner"
            else None,
            over_random=_paired(tables, "this", "random") if policy != "random" else None,
            train_seconds=train_seconds,
            episodes=episodes,
        )

    rows = [summarise(name, False, per_seed) for name, per_seed in contenders.items()]
    for name, (oracle, _) in REFERENCES.items():
        if seeds and all(name in references[s] for s in seeds):
            rows.append(summarise(name, oracle, [(s, references[s][name]) for s in seeds]))
    return sorted(rows, key=lambda r: -r.final.mean)


def _fmt(estimate: Estimate | None, *, sign: bool = False, percent_of: float | None = None) -> str:
    """``mean ± half-width``; with ``percent_of`` (the row's own mean) the difference also as a
    percentage of the other policy's mean (``this - other`` over ``other``)."""
    if estimate is None:
        return ""
    mean = f"{estimate.mean:+,.1f}" if sign else f"{estimate.mean:,.1f}"
    text = mean if math.isnan(estimate.half_width) else f"{mean} ± {estimate.half_width:,.1f}"
    if percent_of is not None:
        text += f" ({estimate.mean / (percent_of - estimate.mean):+.1%})"
    return text


def row_cells(rank: int, row: Row) -> list[str]:
    """A leaderboard row as the printed cells (:data:`COLUMNS`)."""
    return [
        str(rank),
        row.policy,
        "oracle" if row.oracle else "",
        str(row.seeds),
        _fmt(row.final),
        _fmt(row.regret),
        "" if math.isnan(row.regret_percent) else f"{row.regret_percent:.1f}%",
        _fmt(row.over_best_no_learning, sign=True),
        _fmt(row.over_belief_planner, sign=True, percent_of=row.final.mean),
        _fmt(row.over_random, sign=True),
        "" if row.train_seconds is None else f"{row.train_seconds:.0f}",
        "" if row.episodes is None else f"{row.episodes:,}",
    ]


def write_leaderboard(rows: Sequence[Row], out: Path, *, title: str) -> str:
    """Write ``leaderboard.md`` and ``leaderboard.csv`` into ``out``; returns the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    cells = [row_cells(rank, row) for rank, row in enumerate(rows, start=1)]
    with (out / "leaderboard.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        writer.writerows(cells)
    lines = [f"### {title}", "", "| " + " | ".join(COLUMNS) + " |"]
    lines.append("|" + "---|" * len(COLUMNS))
    lines += ["| " + " | ".join(c) + " |" for c in cells]
    planner = next((row for row in rows if row.policy == "planner"), None)
    if planner is not None and planner.over_belief_planner is not None:
        lines += [
            "",
            f"Value of knowing the user (planner - belief planner, paired): "
            f"{_fmt(planner.over_belief_planner, percent_of=planner.final.mean)}; the "
            "belief planner knows the model but not the user's type or exposure, so this "
            "bounds from above what telling the types apart perfectly is worth.",
        ]
    markdown = "\n".join(lines) + "\n"
    (out / "leaderboard.md").write_text(markdown, encoding="utf-8")
    return markdown


def plot(runs: Mapping[str, Sequence[Path]], path: Path, *, title: str) -> Path:
    """Learning curves of the contenders (mean over seeds with a band) and the references."""
    from fedrec.eval.etror import aggregate, load_run
    from fedrec.eval.plots import plot_learning_curves

    groups = []
    for name, paths in runs.items():
        if paths:
            (group,) = aggregate([load_run(p) for p in paths])
            groups.append(dataclasses.replace(group, label=name))
    # budgets differ 30-fold (3,000 to 100,000 episodes): a log axis shows every curve
    return plot_learning_curves(groups, path, title=title, window=100, log_episodes=True)


# --------------------------------------------------------------------------------- command line


def _setting_names() -> tuple[str, ...]:
    return tuple(SETTINGS)


def _contender_names() -> tuple[str, ...]:
    return tuple(CONTENDERS)


@dataclasses.dataclass(frozen=True)
class BenchLongTermConfig:
    """What ``fedrec bench longterm`` runs."""

    settings: tuple[str, ...] = option(
        tuple(SETTINGS), choices=_setting_names, cli_choices=_setting_names, metavar="SETTING"
    )
    """the leaderboards to build"""
    agents: tuple[str, ...] | None = option(
        None,
        choices=_contender_names,
        cli_choices=_contender_names,
        metavar="AGENT",
        help="contenders (default: every contender of the setting: "
        + ", ".join(CONTENDERS)
        + "; rule_search_adaptive_long, rule_search_sequential, rule_search_sequential_long and "
        "rule_search_fitted on user-types only; "
        "rule_search_adaptive_xl and rule_search_evidence only when named)",
    )
    seeds: int = option(3, min=1)
    """seeds per contender"""
    first_seed: int = option(0, min=0)
    """the seeds are FIRST, FIRST + 1, ..."""
    episodes: int | None = option(None, min=1)
    """training episodes for every contender (default: each contender's own budget)"""
    eval_episodes: int = option(500, min=1)
    """held-out episodes"""
    out: str | None = None
    """output folder (default runs/bench/longterm/HASH of the configuration; results/longterm
    holds the committed leaderboards)"""
    plot: bool = True
    """write the learning-curve PNGs"""
    progress: bool = True
    """progress bars"""

    def __post_init__(self) -> None:
        harness.check_fields(self)

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))

    def out_path(self) -> Path:
        """``--out``, or ``runs/bench/longterm/HASH`` of the configuration."""
        if self.out is not None:
            return Path(self.out)
        names = ("settings", "agents", "seeds", "first_seed", "episodes", "eval_episodes")
        return harness.default_out("longterm", {name: getattr(self, name) for name in names})


def add_parser(bench_subparsers: argparse._SubParsersAction) -> None:
    harness.add_bench_parser(
        bench_subparsers,
        "longterm",
        BenchLongTermConfig,
        help="the long-term planning leaderboard (SlateQ, rule search, PPO vs heuristics, planner)",
        description=(__doc__.split("\n\n")[1] if __doc__ else "")
        + " A default run (every contender, 3 seeds, 3 settings: 66 training runs of 1 to "
        "30 minutes) takes about 10 hours on a 2-core machine; finished runs are read, not "
        "retrained.",
        handler=run,
    )


def _contenders(setting_name: str, agents: Sequence[str] | None) -> list[str]:
    """The contenders of a setting: ``agents``, else every contender that runs on it."""
    if agents is not None:
        return list(agents)
    return [
        name
        for name, contender in CONTENDERS.items()
        if contender.settings is None or setting_name in contender.settings
    ]


def run(args: argparse.Namespace) -> int:
    """``fedrec bench longterm``: train or read every run, print and write the leaderboards."""
    config = harness.config_from_args(BenchLongTermConfig, args)
    out = config.out_path()
    plan = {setting: _contenders(setting, config.agents) for setting in config.settings}
    for setting_name, chosen in plan.items():  # before anything trains
        folder = out / setting_name
        present = {str(p.parent.relative_to(folder)) for p in folder.glob("*/seed*/config.json")}
        made = {f"{c}/seed{s}" for c in chosen for s in config.seed_list}
        harness.check_subset(folder, present, made, what="runs")
    from fedrec.eval.tables import View, current_view, show, write_csv

    view, tables = current_view(), []
    for setting_name, chosen in plan.items():
        runs: dict[str, list[Path]] = {}
        for contender in chosen:
            runs[contender] = [
                train_contender(
                    setting_name,
                    contender,
                    seed=seed,
                    out=out,
                    episodes=config.episodes,
                    eval_episodes=config.eval_episodes,
                    progress=config.progress,
                )
                for seed in config.seed_list
            ]
        from fedrec.train.references import complete_references

        for path in (p for paths in runs.values() for p in paths):
            complete_references(path)  # references added since the run was trained
        title = SETTINGS[setting_name].title
        rows = leaderboard(runs)
        markdown = write_leaderboard(rows, out / setting_name, title=title)
        table = text_table(markdown, key=setting_name)
        tables.append(table)
        # each leaderboard as it is ready; the CSV of them all at the end
        show([table], View(wide=view.wide), wide=lambda text=markdown: print(text))
        if config.plot:
            png = plot(runs, out / setting_name / "learning_curves.png", title=title)
            harness.log(f"learning curves: {png}")
    if view.csv is not None:
        write_csv(tables, view.csv)
    return 0


#: The compact view's columns (full header -> short one) and the legend of the short ones.
COMPACT = {
    "rank": "#",
    "policy": "policy",
    "seeds": "n",
    "final greedy return": "final",
    "regret to planner": "regret",
    "regret %": "regret %",
    "vs best no-learning": "vs no-learning",
    "train s/run": "train s",
}
LEGEND = {
    "n": "seeds",
    "final": "final greedy return",
    "regret": "planner - policy, paired",
    "vs no-learning": "policy - the best fixed heuristic, paired",
    "train s": "training seconds per run",
    "*": "oracle: reads the user's hidden state",
}


def text_table(markdown: str, *, key: str = "") -> Any:
    """A leaderboard of :func:`write_leaderboard` as a :class:`fedrec.eval.tables.TextTable`
    (oracles marked with * in the compact view)."""
    from fedrec.eval.tables import tables_from_markdown

    (table,), _ = tables_from_markdown(markdown)
    table.compact = COMPACT
    policy, oracle = table.columns.index("policy"), table.columns.index("oracle")
    marked = [row[policy] + (" *" if row[oracle] else "") for row in table.rows]
    table.short_cells = {"policy": marked}
    table.legend = LEGEND if any(row[oracle] for row in table.rows) else LEGEND | {"*": ""}
    table.legend = {k: v for k, v in table.legend.items() if v}
    table.text_columns = ("policy",)
    table.key = key
    return table
