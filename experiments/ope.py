"""``fedrec bench ope``: the off-policy estimators validated against the truth.

For each setting (ChocKale-v0's first step, where only slot 1 counts; ChocKaleSlate-v0's first
step, MNL choice; ChocKaleCascade-v0's first step, cascade clicks; the first-slot and cascade
settings again with slates of 5 out of 7; and episodes of
ChocKaleLongTerm-v0, ChocKaleUserTypes-v0, the two-platform ChocKaleMultiPlatform-v0 and
InterestEvolution-v0) it computes the target policy's true value by Monte Carlo with its 95%
interval, logs --datasets independent data sets with a uniformly random logger, and reports for
every estimator and data-set size (--sizes) the mean estimate, bias, bias / SE (SE of the bias:
the spread over data sets and the truth's Monte Carlo error), standard deviation, RMSE and the
coverage of the estimator's own 95% intervals. The slate settings run slate IPS, IIPS, RIPS,
PseudoInverse and Cascade-DR (and the bandit estimators where only the top item counts), the
episodic ones PDIS, WDR and MIS with the state ratio set to 1. Writes SETTING.json per setting (a
finished one with the same configuration is read, not recomputed), ope.md and ope.csv. The default
run took 20 min on this project's 2-core machine under load (a progress bar shows the ETA).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import time
from pathlib import Path
from typing import Any

from fedrec.experiments import harness
from fedrec.experiments.harness import option

BENCH = "ope"


def _setting_names() -> tuple[str, ...]:
    from fedrec.eval.ope.validation import SETTINGS

    return tuple(SETTINGS)


@dataclasses.dataclass(frozen=True)
class BenchOpeConfig:
    """What ``fedrec bench ope`` runs."""

    settings: tuple[str, ...] | None = option(
        None,
        choices=_setting_names,
        cli_choices=_setting_names,
        metavar="SETTING",
        help="the settings (default: all of first-slot, slate-mnl, cascade, longterm, "
        "user-types, multi-platform, interest-evolution, first-slot-k5, cascade-k5)",
    )
    datasets: int = option(500, min=2)
    """independently logged data sets per setting and size"""
    sizes: tuple[int, ...] = option((100, 300, 1000), min=2)
    """data-set sizes (episodes, or rows of the slate settings); the data sets of size n are
    the first n rows of --datasets disjoint blocks of max(sizes) rows"""
    truth_episodes: int = option(2_000_000, min=2)
    """Monte Carlo episodes of the target policy for its true value"""
    horizon: int = option(5, min=1)
    """steps per episode of the sequential settings"""
    logger_beta: float = 0.0
    """the logger: Plackett-Luce with logits beta * score (0: uniformly random slates)"""
    slate_target_beta: float = 2.0
    """the target's beta in the single-step slate settings"""
    sequential_target_beta: float = 1.0
    """the target's beta in the sequential settings"""
    seed: int = option(0, min=0)
    """seed of the logged data and of the Monte Carlo truth"""
    out: str | None = None
    """output folder (default runs/bench/ope/HASH of the configuration; results/ope holds the
    committed tables)"""
    progress: bool = True
    """progress bars"""

    def __post_init__(self) -> None:
        harness.check_fields(self)

    @property
    def setting_list(self) -> list[str]:
        return list(self.settings) if self.settings is not None else list(_setting_names())

    def key(self) -> dict[str, Any]:
        """What the numbers depend on (not --out or --progress)."""
        skip = ("out", "progress")
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip
        }

    def out_path(self) -> Path:
        if self.out is not None:
            return Path(self.out)
        return harness.default_out(BENCH, self.key())


#: ``--quick``: small enough for a test (seconds per setting).
QUICK = {"datasets": 40, "sizes": (50, 100), "truth_episodes": 40_000}

SUMMARY_KEYS = ("mean", "bias", "bias_se", "bias_z", "std", "rmse", "relative_rmse", "coverage")
SETTING_FILE = harness.record(
    {
        "config": harness.record({}),
        "setting": harness.string,
        "truth": harness.record(
            {
                "value": harness.finite,
                "std_error": harness.finite,
                "ci_half_width": harness.finite,
                "episodes": harness.integer,
            }
        ),
        "rows": harness.list_of(
            harness.record(
                {
                    "n": harness.integer,
                    "estimator": harness.string,
                    "expect": harness.string,
                    "datasets": harness.integer,
                    **{key: harness.number for key in SUMMARY_KEYS},
                }
            ),
            min_length=1,
        ),
        "seconds": harness.non_negative,
    }
)


def run_setting(name: str, config: BenchOpeConfig) -> dict[str, Any]:
    """Truth, logging and every estimator of one setting: the JSON record of ``NAME.json``."""
    from fedrec.eval.ope import validation as v

    settings = v.settings(config.horizon)
    setting = settings[name]
    index = list(settings).index(name)  # stable: the same numbers when run alone
    beta = config.slate_target_beta if setting.family == "slate" else config.sequential_target_beta
    start = time.perf_counter()
    truth = v.true_value(setting, beta, config.truth_episodes, seed=_seed(config.seed, index, 0))
    data = v.log_data(
        setting,
        logger_beta=config.logger_beta,
        target_beta=beta,
        episodes=config.datasets * max(config.sizes),
        seed=_seed(config.seed, index, 1),
    )
    from tqdm.auto import tqdm

    with tqdm(
        total=config.datasets * len(config.sizes),
        desc=f"ope {name}",
        unit="dataset",
        disable=not config.progress,
    ) as bar:
        estimates = v.estimate_all(
            setting,
            data,
            datasets=config.datasets,
            sizes=sorted(config.sizes),
            logger_beta=config.logger_beta,
            target_beta=beta,
            progress=bar.update,
        )
    rows = []
    for n, table in estimates.items():
        for estimator, cells in table.items():
            summary = v.summarise(cells, truth)
            rows.append(
                {
                    "n": int(n),
                    "estimator": estimator,
                    "expect": v.assumption(setting, estimator)[0],
                    **summary,
                }
            )
    return {
        "config": harness.json_ready(config.key()),
        "setting": name,
        "title": setting.title,
        "structure": setting.structure,
        "target_beta": beta,
        "truth": truth,
        "rows": rows,
        "seconds": time.perf_counter() - start,
    }


def _seed(seed: int, index: int, stream: int) -> int:
    import numpy as np

    return int(np.random.SeedSequence([seed, index, stream]).generate_state(1)[0])


# --------------------------------------------------------------------------------- tables

COLUMNS = ["n", "estimator", "expect", "mean", "bias", "bias / SE", "std", "RMSE", "CI coverage"]
#: The compact view's columns (full header -> short one) and the legend of the short ones.
COMPACT = {
    "n": "n",
    "estimator": "estimator",
    "expect": "expect",
    "bias": "bias",
    "bias / SE": "z",
    "RMSE": "RMSE",
    "CI coverage": "cov",
    "verdict": "verdict",
}
LEGEND = {"z": "bias / SE of the bias", "cov": "coverage of the estimator's 95% CI"}


def _cells(row: dict[str, Any]) -> list[str]:
    return [
        str(row["n"]),
        row["estimator"],
        row["expect"],
        f"{row['mean']:.4g}",
        f"{row['bias']:+.3g}",
        f"{row['bias_z']:+.1f}",
        f"{row['std']:.3g}",
        f"{row['rmse']:.3g}",
        f"{row['coverage']:.2f}",
    ]


def _markdown(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def verdict(row: dict[str, Any]) -> str:
    """Whether a row agrees with its expectation: unbiased rows within 3 SE, biased rows
    (assumption fails) flagged when the bias is detectable."""
    within = abs(row["bias_z"]) <= 3
    if row["expect"] == "unbiased":
        return "ok" if within else "FAILS"
    if row["expect"] == "biased":
        return "bias undetected" if within else "biased, as expected"
    return "within 3 SE" if within else "biased"


def pseudoinverse_check(record: dict[str, Any]) -> list[list[str]]:
    """PseudoInverse vs standard slate IPS per size: RMSE, and which is lower."""
    by = {(r["n"], r["estimator"]): r for r in record["rows"]}
    out = []
    for n in sorted({r["n"] for r in record["rows"]}):
        pi, ips = by.get((n, "PseudoInverse")), by.get((n, "slate IPS"))
        if pi and ips:
            out.append(
                [
                    record["setting"],
                    str(n),
                    f"{ips['rmse']:.3g}",
                    f"{pi['rmse']:.3g}",
                    f"{pi['rmse'] / ips['rmse']:.2f}",
                    f"{pi['bias_z']:+.1f}",
                ]
            )
    return out


def write_tables(records: list[dict[str, Any]], out: Path, config: BenchOpeConfig) -> str:
    """``ope.md`` (a table per setting, the PseudoInverse check) and ``ope.csv``; the markdown."""
    parts = [
        "# Off-policy estimators against the truth",
        "",
        f"`fedrec bench ope`: {config.datasets} logged data sets per setting and size, logger "
        f"Plackett-Luce(beta = {config.logger_beta:g}) (0: uniformly random slates), target "
        f"Plackett-Luce(beta = {config.slate_target_beta:g}) on the slate settings and "
        f"{config.sequential_target_beta:g} on the sequential ones ({config.horizon} steps), "
        f"truth by {config.truth_episodes:,} Monte Carlo episodes, seed {config.seed}. bias / SE: "
        "the bias over its standard error (spread over the data sets and the truth's own Monte "
        "Carlo error); expect: whether the estimator's assumption holds in the setting.",
    ]
    pseudo = []
    for record in records:
        truth = record["truth"]
        parts += [
            "",
            f"## {record['setting']}: {record['title']}",
            "",
            f"{record['structure']}. True value {truth['value']:.4g} ± "
            f"{truth['ci_half_width']:.2g} (95% CI, {truth['episodes']:,} episodes); "
            f"{record['seconds']:.0f} s.",
            "",
            _markdown(
                [*COLUMNS, "verdict"],
                [[*_cells(row), verdict(row)] for row in record["rows"]],
            ),
        ]
        pseudo += pseudoinverse_check(record)
    if pseudo:
        parts += [
            "",
            "## PseudoInverse vs standard slate IPS (slates of 3 and 5)",
            "",
            _markdown(
                [
                    "setting",
                    "size",
                    "slate IPS RMSE",
                    "PseudoInverse RMSE",
                    "ratio",
                    "PI bias / SE",
                ],
                pseudo,
            ),
        ]
    markdown = "\n".join(parts) + "\n"
    (out / "ope.md").write_text(markdown)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["setting", "truth", "truth_ci", *COLUMNS, "verdict"])
    for record in records:
        for row in record["rows"]:
            writer.writerow(
                [
                    record["setting"],
                    f"{record['truth']['value']:.6g}",
                    f"{record['truth']['ci_half_width']:.3g}",
                    *_cells(row),
                    verdict(row),
                ]
            )
    (out / "ope.csv").write_text(buffer.getvalue())
    return markdown


# --------------------------------------------------------------------------------- command line


def add_parser(bench_subparsers: argparse._SubParsersAction) -> None:
    harness.add_bench_parser(
        bench_subparsers,
        BENCH,
        BenchOpeConfig,
        help="validate the off-policy estimators against Monte Carlo truth (bias, RMSE)",
        description=__doc__.split("\n\n")[1] if __doc__ else "",
        handler=run,
        quick="a small run for a smoke test: "
        + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
        + " (options given explicitly win)",
    )


def run(args: argparse.Namespace) -> int:
    """``fedrec bench ope``: compute (or read) every setting, print and write the tables."""
    overrides = QUICK if getattr(args, "quick", False) else {}
    config = harness.config_from_args(BenchOpeConfig, args, **overrides)
    out = config.out_path()
    key = harness.json_ready(config.key())
    saved_config = out / "config.json"
    if saved_config.exists():
        saved = harness.read_cached(saved_config, harness.record({}), "ope configuration")
        harness.check_same(saved_config, saved, key)
    elif out.exists() and any(out.iterdir()):
        present = sorted(p.name for p in out.iterdir())
        raise harness.BenchError(
            f"{out} holds files this command did not write ({', '.join(present[:4])}): choose "
            "another --out"
        )
    harness.write_json(saved_config, key)
    records = []
    for name in config.setting_list:
        path = out / f"{name}.json"
        if path.exists():
            record = harness.read_cached(path, SETTING_FILE, "ope setting record")
            harness.check_same(path, record["config"], key)
            harness.log(f"{name}: read the finished setting {path}")
        else:
            record = run_setting(name, config)
            harness.write_json(path, record)
        records.append(record)
    harness.show_markdown(write_tables(records, out, config), compact=COMPACT, legend=LEGEND)
    bad = [
        f"{r['setting']} {row['estimator']} n={row['n']}"
        for r in records
        for row in r["rows"]
        if verdict(row) == "FAILS"
    ]
    if bad:
        harness.log(f"unbiased estimators off by more than 3 SE: {', '.join(bad)}")
    harness.log(f"tables: {out / 'ope.md'}")
    return 0
