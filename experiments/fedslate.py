"""``fedrec bench fedslate``: FedSlate against SlateQ, FedSlate(exp), FedQ, FedCEM and random, per
platform.

For a setting (the paper's (N, n) = 10x3, 100x10, 500x10; ``sparse``: the sparse team reward;
``5platforms``: five platforms, all with feedback and with two without; ``longterm``: 100x10 with
the long-term dynamics of ``fedrec/ChocKaleLongTerm-v0``, where planning matters; ``user-types``:
``fedrec/ChocKaleMultiPlatformUserTypes-v0``, hidden user types, where no open-loop plan fits
every user) it trains every method for ``--seeds`` seeds with
:func:`fedrec.train.multi_platform.train_multi_platform`, saves the run directories under
``--out``, prints each run's wall time (to stderr with a bare ``--csv``, so that stdout is pure
CSV), then prints the per-platform table of ``fedrec eval`` (ETROR, optimal reward, plateau,
final greedy evaluation, planner, random, with 95% CIs across seeds, beside the paper's
numbers), writes it to ``table.csv`` and writes the learning curves (both beside the runs, for
the runs of this call). Duration: a 5,000-episode FedSlate run at (100, 10) takes about 8.6 min
per method and seed on a free core (SlateQ 2.3 min; FedSlate at 10x3 6.3 min, at 500x10 14 min,
with 5platforms 24 min; docs/fedslate.md, "Speed"), so the default 100x10 setting (6 methods, 3
seeds) takes well over an hour, and --setting 10x3 --episodes 200 --seeds 1 a few minutes.

FedSlate(exp) needs feedback on every platform, so its runs use an env where every platform has
feedback (its platform-B numbers are then not comparable with a no-feedback platform B; the
paper uses it in the sparse-team-reward experiment, where that is the point).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedrec.agents.registry import MULTI_PLATFORM_AGENTS, resolve_multi_platform_agent
from fedrec.experiments import harness
from fedrec.experiments.harness import option
from fedrec.registration import LONG_TERM_KWARGS


@dataclasses.dataclass(frozen=True)
class Setting:
    """Env variants (suffix -> kwargs), default methods and the paper scenario to compare with."""

    envs: dict[str, dict[str, Any]]
    methods: tuple[str, ...]
    scenario: str = "basic"
    paper: str = "auto"
    env_id: str = "fedrec/ChocKaleMultiPlatform-v0"


_BASIC = ("slateq", "fedslate", "fedslate_exp", "fedq", "fedcem", "random")
SETTINGS: dict[str, Setting] = {
    "10x3": Setting({"": {"num_candidates": 10, "slate_size": 3}}, _BASIC),
    "100x10": Setting({"": {"num_candidates": 100, "slate_size": 10}}, _BASIC),
    "500x10": Setting({"": {"num_candidates": 500, "slate_size": 10}}, _BASIC),
    "sparse": Setting(
        {
            "": {
                "num_candidates": 100,
                "slate_size": 10,
                "reward_mode": "sparse_team",
                "reward_interval": 10,
            }
        },
        ("fedslate", "fedslate_exp", "slateq", "random"),
        scenario="sparse_team",
    ),
    "5platforms": Setting(
        {
            "all-feedback": {
                "num_candidates": 100,
                "slate_size": 10,
                "num_platforms": 5,
                "feedback": [True] * 5,
            },
            "two-without": {
                "num_candidates": 100,
                "slate_size": 10,
                "num_platforms": 5,
                "feedback": [True, True, True, False, False],
            },
        },
        ("fedslate", "slateq", "random"),
        paper="none",
    ),
    "longterm": Setting(
        {
            "": {
                "num_candidates": 100,
                "slate_size": 10,
                "sensitivity": LONG_TERM_KWARGS["sensitivity"],
            }
        },
        ("slateq", "fedslate", "fedq", "fedcem", "random"),
        paper="none",
    ),
    "user-types": Setting(
        {"": {}},
        ("fedcem", "fedcem_adaptive", "per_platform", "random"),
        paper="none",
        env_id="fedrec/ChocKaleMultiPlatformUserTypes-v0",
    ),
    "ablation": Setting(
        {"": {"num_candidates": 100, "slate_size": 10}}, ("fedslate", "fedslate_linear")
    ),
}


def _presets(method: str) -> dict[str, Any]:
    spec = MULTI_PLATFORM_AGENTS.get(method)
    return dict(spec.presets) if spec is not None else {}


def env_for(method: str, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The env kwargs a method runs with: FedSlate(exp) gets feedback on every platform."""
    kwargs = dict(env_kwargs)
    if _presets(method).get("method") == "fedslate_exp":
        kwargs["feedback"] = [True] * int(kwargs.get("num_platforms", 2))
    return kwargs


def method_label(method: str) -> str:
    """A method's name in tables: the built-in name, or the class name of ``path.py:Class``."""
    return method if method in MULTI_PLATFORM_AGENTS else method.rpartition(":")[2]


def run_dirs(
    setting: str,
    *,
    seeds: int,
    episodes: int,
    first_seed: int = 0,
    methods: tuple[str, ...] | None = None,
    out: Path,
    num_users: int = 16,
    eval_episodes: int = 500,
    planner: bool = True,
    resume: bool = False,
    progress: bool = True,
    agent_kwargs: dict[str, Any] | None = None,
    env_overrides: dict[str, Any] | None = None,
    method_options: dict[str, dict[str, Any]] | None = None,
    log: Any = harness.log,
) -> list[Path]:
    """Train every (env variant, method, seed) of ``setting``; returns the run directories.

    Before anything trains, ``out`` is checked: a run directory in it whose ``config.json`` holds
    another run (episodes, seed, env or users differ), or one this call does not make (the
    table would drop it), is refused (one line, :class:`~fedrec.experiments.harness.BenchError`).
    A run of the same setup is trained again (or continued with ``resume``). ``method_options``
    maps a method (as in ``methods``) to overrides of its Config (:func:`parse_method_options`)."""
    from fedrec.train.multi_platform import MultiPlatformTrainConfig, train_multi_platform

    spec = SETTINGS[setting]
    plan = []
    for suffix, setting_kwargs in spec.envs.items():
        env_kwargs = {**setting_kwargs, **(env_overrides or {})}
        for method in methods or spec.methods:
            name = method_label(method)
            label = name + (f" [{suffix}]" if suffix else "")
            if _presets(method).get("method") == "fedslate_exp":
                label += " (all feedback)"
            for seed in range(first_seed, first_seed + seeds):
                path = out / "-".join(x for x in (suffix, name) if x) / f"seed{seed}"
                # The shared overrides (e.g. the demo's short schedule) apply to the built-in
                # FedSlate-family methods; a user's method keeps its own Config.
                extra = dict(agent_kwargs or {}) if "method" in _presets(method) else {}
                extra.update((method_options or {}).get(method, {}))
                config = MultiPlatformTrainConfig(
                    env_id=spec.env_id,
                    method=method,
                    episodes=episodes,
                    num_users=num_users,
                    seed=seed,
                    env_kwargs=env_for(method, env_kwargs),
                    agent_kwargs=extra,
                    eval_episodes=eval_episodes,
                    planner=planner,
                    progress=progress,
                    label=label,
                )
                plan.append((path, config))
    check_out(out, plan)
    check_requirements(plan)
    paths = []
    for path, config in plan:
        start = time.perf_counter()
        result = train_multi_platform(config, out_dir=path, resume=resume)
        log(
            f"{config.label} seed {config.seed}: {episodes} episodes in {result.wall_time:.1f} s "
            f"training ({time.perf_counter() - start:.1f} s with evaluation) -> {path}"
        )
        paths.append(path)
    return paths


def check_requirements(plan: list[tuple[Path, Any]]) -> None:
    """Refuse, before anything trains, a method whose env lacks what its class ``REQUIRES``
    (e.g. ScoreRelay's shared_catalogue=True), in one line naming it."""
    from fedrec.agents.multi_platform import check_requirements as check
    from fedrec.train.multi_platform import make_env

    for _, config in plan:
        cls, _ = resolve_multi_platform_agent(config.method)
        if getattr(cls, "REQUIRES", None):
            check(cls, make_env(config, 1))


def _check_type(cls: type, key: str, value: Any) -> str | None:
    """Why ``value`` does not fit the Config field ``key`` of ``cls`` (None: it fits, or the
    annotation is not a plain one to check)."""
    import typing

    hint = typing.get_type_hints(cls.Config).get(key)
    if typing.get_origin(hint) is typing.Literal:
        choices = typing.get_args(hint)
        return None if value in choices else f"must be one of {choices}"
    if hint is bool:
        return None if isinstance(value, bool) else "must be True or False"
    if hint is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "must be an int"
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else "must be a number"
    if hint is str:
        return None if isinstance(value, str) else "must be a string"
    if typing.get_origin(hint) is tuple:
        return None if isinstance(value, tuple) else "must be a tuple, e.g. 64,32"
    return None


def parse_method_options(
    entries: Sequence[str], methods: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """``METHOD:KEY=VALUE`` entries as ``{method: {key: value}}``, each checked now: METHOD is
    one of ``methods`` (its name as given, or the class name of a ``path.py:Class``), KEY a
    field of its Config that its name does not preset, and the values build a valid Config
    (its own checks). Each problem is one ``ValueError`` naming the entry; an unknown key lists
    the method's keys."""
    from fedrec.agents.registry import make_config
    from fedrec.util import parse_value

    by_label = {method_label(m): m for m in methods}
    parsed: dict[str, dict[str, Any]] = {}
    for entry in entries:
        target, equals, value = entry.partition("=")
        method, colon, key = target.rpartition(":")
        if not equals or not colon or not method or not key:
            raise ValueError(
                f"--method-options {entry!r}: expected METHOD:KEY=VALUE, e.g. fedslate:"
                "learning_rate=0.001 or my_agent.py:MyMethod:bins=20"
            )
        method = method if method in methods else by_label.get(method, method)
        if method not in methods:
            raise ValueError(
                f"--method-options {entry!r}: {method} is not among the methods run "
                f"({', '.join(methods)})"
            )
        cls, presets = resolve_multi_platform_agent(method)
        fields = sorted(f.name for f in dataclasses.fields(cls.Config))
        if key not in fields:
            shown = ", ".join(f for f in fields if f not in presets) or "none"
            raise ValueError(
                f"--method-options {entry!r}: {method_label(method)} has no option {key!r}; "
                f"its options: {shown}"
            )
        if key in presets:
            raise ValueError(
                f"--method-options {entry!r}: the name {method} presets {key}={presets[key]!r}"
            )
        parsed_value = parse_value(value)
        if isinstance(parsed_value, list):
            parsed_value = tuple(parsed_value)
        problem = _check_type(cls, key, parsed_value)
        if problem is not None:
            raise ValueError(f"--method-options {entry!r}: {key} {problem}, got {value!r}")
        parsed.setdefault(method, {})[key] = parsed_value
    for method, options in parsed.items():
        cls, presets = resolve_multi_platform_agent(method)
        try:
            make_config(cls, {**presets, **options})
        except (TypeError, ValueError) as error:
            raise ValueError(f"--method-options for {method_label(method)}: {error}") from None
    return parsed


def check_out(out: Path, plan: list[tuple[Path, Any]]) -> None:
    """Refuse ``out`` when it holds runs of another setup or runs this call does not make."""
    present = {str(p.parent.relative_to(out)) for p in out.glob("*/seed*/config.json")}
    made = {str(path.relative_to(out)) for path, _ in plan}
    harness.check_subset(out, present, made, what="runs")
    for path, config in plan:
        saved_path = path / "config.json"
        if not saved_path.is_file():
            continue
        saved = harness.read_cached(saved_path, harness.record({}), "run configuration")
        expected = {
            "env_id": config.env_id,
            "env_kwargs": config.env_kwargs,
            "episodes": config.episodes,
            "seed": config.seed,
            "num_envs": config.num_users,
        }
        harness.check_same(path, {key: saved.get(key) for key in expected}, expected, what="a run")


def print_table(paths: Sequence[Path], setting: str, *, plot: Path | None) -> int:
    """The ``fedrec eval`` table (and plot) of the runs, with the paper's columns."""
    from fedrec.eval.etror import find_runs
    from fedrec.eval.report import EvalOptions, load_checked, report

    spec = SETTINGS[setting]
    runs = [load_checked(path) for path in find_runs(paths)]
    options = EvalOptions(paper=spec.paper, scenario=spec.scenario)
    csv_path = None if plot is None else plot.with_name("table.csv")
    report(runs, options, csv_path=csv_path, plot=plot is not None, out=plot)
    return 0


@dataclasses.dataclass(frozen=True)
class BenchFedSlateConfig:
    """What ``fedrec bench fedslate`` runs."""

    setting: str = option("100x10", choices=tuple(SETTINGS))
    """the setting: env variants, default methods and the paper's scenario"""
    seeds: int = option(3, min=1)
    """seeds per method"""
    first_seed: int = option(0, min=0)
    """the seeds are FIRST, FIRST + 1, ..."""
    episodes: int = option(5000, min=1)
    """training user-episodes"""
    methods: tuple[str, ...] | None = option(
        None,
        metavar="METHOD",
        help="methods to run (default: the setting's): built-in names ("
        + ", ".join(MULTI_PLATFORM_AGENTS)
        + ") or module:Class / path/to/file.py:Class of your own MultiPlatformAgent",
    )
    out: str | None = None
    """output folder (default runs/bench/fedslate/SETTING-HASH of the configuration;
    results/fedslate/SETTING holds the committed runs)"""
    num_users: int = option(16, min=1)
    """users simulated in parallel"""
    eval_episodes: int = option(500, min=1)
    """held-out episodes"""
    planner: bool = True
    """evaluate the joint planner (--no-planner skips it)"""
    env_kwargs: tuple[tuple[str, Any], ...] = option(
        (), flag="--env-kwarg", append=True, parse=harness.key_value, metavar="KEY=VALUE"
    )
    """override the setting's env keyword arguments, repeatable (e.g. --env-kwarg
    shared_catalogue=True)"""
    method_options: tuple[str, ...] = option(
        (), flag="--method-options", append=True, metavar="METHOD:KEY=VALUE"
    )
    """a method's hyperparameter, repeatable: METHOD as in --methods (or the class name of a
    path.py:Class), KEY a field of its Config (an unknown one is refused with the list), e.g.
    --method-options fedslate:learning_rate=0.001 --method-options ScoreRelay:bins=20 (default
    none: each method's own defaults)"""
    resume: bool = False
    """continue existing runs"""
    progress: bool = True
    """progress bars"""

    def __post_init__(self) -> None:
        harness.check_fields(self)
        for method in self.methods or ():
            resolve_multi_platform_agent(method)  # an unknown name or a bad class fails now
        self.options_by_method()  # a malformed entry or an unknown key fails now

    def options_by_method(self) -> dict[str, dict[str, Any]]:
        """``--method-options`` as ``{method: {key: value}}`` (:func:`parse_method_options`)."""
        methods = self.methods or SETTINGS[self.setting].methods
        return parse_method_options(self.method_options, methods)

    def key(self) -> dict[str, Any]:
        """What the runs depend on (the hash of the default output folder)."""
        return {
            "setting": self.setting,
            "seeds": self.seeds,
            "first_seed": self.first_seed,
            "episodes": self.episodes,
            "methods": self.methods,
            "num_users": self.num_users,
            "eval_episodes": self.eval_episodes,
            "no_planner": not self.planner,
            "env_kwarg": dict(self.env_kwargs),
            **({"method_options": self.method_options} if self.method_options else {}),
        }

    def out_path(self) -> Path:
        """``--out``, or ``runs/bench/fedslate/SETTING-HASH`` of the configuration."""
        if self.out is not None:
            return Path(self.out)
        return harness.default_out("fedslate", self.key(), label=self.setting)


def add_parser(bench_subparsers: argparse._SubParsersAction) -> None:
    harness.add_bench_parser(
        bench_subparsers,
        "fedslate",
        BenchFedSlateConfig,
        help="FedSlate vs SlateQ, FedSlate(exp), FedQ, FedCEM and random on the multi-platform env",
        description=__doc__.split("\n\n")[1] if __doc__ else "",
        handler=run,
    )


def run(args: argparse.Namespace) -> int:
    """``fedrec bench fedslate``: train the setting's runs, print and write the eval table."""
    config = harness.config_from_args(BenchFedSlateConfig, args)
    out = config.out_path()
    paths = run_dirs(
        config.setting,
        seeds=config.seeds,
        episodes=config.episodes,
        first_seed=config.first_seed,
        methods=config.methods,
        out=out,
        num_users=config.num_users,
        eval_episodes=config.eval_episodes,
        planner=config.planner,
        resume=config.resume,
        progress=config.progress,
        env_overrides=dict(config.env_kwargs),
        method_options=config.options_by_method(),
    )
    return print_table(paths, config.setting, plot=out / "learning_curves.png")
