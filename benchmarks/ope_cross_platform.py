"""Cross-platform OPE: a target's value on platform B (no feedback), estimated from A's logs.

The estimators use platform A's logs or only what the federation may carry; each is compared
with B's Monte Carlo value.

Usage: ``python benchmarks/ope_cross_platform.py [--datasets 200] [--users 500]
[--truth-users 20000] [--seed 0] [--out DIR] [--overwrite]``.

Each logged dataset is one episode of ``--users`` users on the two-platform Choc-vs-Kale env
(FedSlate defaults: 10 candidates, slates of 3, 61 visits per platform), both platforms logging
with ``0.5 · top_x + 0.5 · uniform`` (exact propensities). A's log has engagement and clicks,
B's only its contexts and slates. Targets: ``top_x`` (the loggers' greedy rule) and ``bottom_x``
(reached only through the uniform half, weight 1440). Settings:

* ``matched``: A and B are the two platforms of one env (the same users);
* ``B users 10x more sensitive``: B's world has ``sensitivity=0.1`` (A's 0.01);
* ``B catalogue reversed``: B's world has ``semantics="prose"`` (on B the feature x is kale-ness,
  so B's choc items are A's kale ones).

A mismatched setting is emulated with two runs of the env (the env's parameters are shared by
its platforms): A's logs from A's world, B's logs and B's true value from B's world, with
independent seeds. Dataset d uses seed ``seed + d`` (A's world, and B's in ``matched``),
``seed + 100000 + d`` (B's mismatched worlds) and ``seed + 200000 + d`` (the 20 bootstrap refits
of A's model); the true values use ``seed + 1000000``. Writes
``results.json`` and ``table.md`` into ``--out`` (default ``runs/benchmarks/ope_cross_platform/``;
the committed files are in ``results/ope_platforms``; an earlier run's files are replaced only
with ``--overwrite``) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from fedrec.eval.ope import cross_platform as cp
from fedrec.experiments.harness import add_out_arguments, claim_outputs, run_script, script_out

SETTINGS: dict[str, dict[str, object] | None] = {
    "matched": None,  # B is the second platform of A's env
    "B users 10x more sensitive": {"sensitivity": 0.1},
    "B catalogue reversed": {"semantics": "prose"},
}
TARGETS = ("top_x", "bottom_x")
ESTIMATORS = (
    "naive",
    "transfer IPS",
    "transfer SNIPS",
    "transfer DR",
    "federated DM",
    "federated DM (bootstrap)",
)
#: Bootstrap refits of A's model carried with it (for the federated DM's interval).
REPLICATES = 20


def estimates(log_a: cp.PlatformLog, log_b: cp.PlatformLog, target: str, model, carried, reps):
    return {
        "naive": cp.naive(log_a),
        "transfer IPS": cp.transfer_ips(log_a, target),
        "transfer SNIPS": cp.transfer_snips(log_a, target),
        "transfer DR": cp.transfer_dr(log_a, target, model),
        "federated DM": cp.federated_dm(log_b, target, carried),
        "federated DM (bootstrap)": cp.federated_dm(log_b, target, carried, replicates=reps),
    }


def summarise(values: np.ndarray, lows: np.ndarray, highs: np.ndarray, truth: float) -> dict:
    count = len(values)
    bias = float(values.mean() - truth)
    sd = float(values.std(ddof=1))
    return {
        "mean": float(values.mean()),
        "bias": bias,
        "bias_se": sd / math.sqrt(count),
        "sd": sd,
        "rmse": float(np.sqrt(np.mean((values - truth) ** 2))),
        "coverage": float(np.mean((lows <= truth) & (truth <= highs))),
        "datasets": count,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=int, default=200)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--truth-users", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    add_out_arguments(parser, "ope_cross_platform", what="folder of results.json and table.md")
    args = parser.parse_args()
    args.out = script_out("ope_cross_platform", args.out)
    claim_outputs([args.out / "results.json", args.out / "table.md"], overwrite=args.overwrite)
    start = time.perf_counter()

    truths: dict[str, dict[str, dict]] = {}
    for setting, world in SETTINGS.items():
        truths[setting] = {}
        for target in TARGETS:
            run = cp.simulate(
                args.truth_users, seed=args.seed + 1_000_000, env_kwargs=world, target=target
            )
            truths[setting][target] = dataclass_dict(cp.true_value(run))
    # V_A(target) in A's world: the matched setting's only transfer gap is the visit order
    a_truths = {}
    for target in TARGETS:
        run = cp.simulate(
            args.truth_users,
            seed=args.seed + 1_000_000,
            target=target,
            target_platform="platform_a",
        )
        a_truths[target] = dataclass_dict(cp.true_value(run))

    collected = {
        (s, t, e): {"value": [], "low": [], "high": []}
        for s in SETTINGS
        for t in TARGETS
        for e in ESTIMATORS
    }
    for d in range(args.datasets):
        run_a = cp.simulate(args.users, seed=args.seed + d)
        log_a = run_a.logs["platform_a"]
        model = cp.fit_reward_model(log_a)
        carried = cp.carry_reward_model(model, num_candidates=10)
        reps = [
            cp.carry_reward_model(refit, num_candidates=10)
            for refit in cp.bootstrap_reward_models(log_a, REPLICATES, seed=args.seed + 200_000 + d)
        ]
        for setting, world in SETTINGS.items():
            if world is None:
                log_b = run_a.logs["platform_b"]
            else:
                log_b = cp.simulate(
                    args.users, seed=args.seed + 100_000 + d, env_kwargs=world
                ).logs["platform_b"]
            for target in TARGETS:
                found = estimates(log_a, log_b, target, model, carried, reps)
                for name, estimate in found.items():
                    slot = collected[(setting, target, name)]
                    slot["value"].append(estimate.value)
                    slot["low"].append(estimate.ci_low)
                    slot["high"].append(estimate.ci_high)

    rows = []
    for (setting, target, name), slot in collected.items():
        truth = truths[setting][target]["value"]
        stats = summarise(*(np.array(slot[k]) for k in ("value", "low", "high")), truth)
        rows.append({"setting": setting, "target": target, "estimator": name, **stats})
    seconds = time.perf_counter() - start
    result = {
        "description": __doc__.splitlines()[0],
        "command": (
            f"python benchmarks/ope_cross_platform.py --datasets {args.datasets} --users "
            f"{args.users} --truth-users {args.truth_users} --seed {args.seed}"
        ),
        "settings": {k: v or "same env as A" for k, v in SETTINGS.items()},
        "loggers": "0.5 * top_x + 0.5 * uniform on both platforms",
        "bootstrap_replicates": REPLICATES,
        "true_value_b": truths,
        "true_value_a": a_truths,
        "rows": rows,
        "seconds": round(seconds, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (args.out / "table.md").write_text(table)
    print(table)


def dataclass_dict(estimate) -> dict:
    return {
        "value": estimate.value,
        "ci_low": estimate.ci_low,
        "ci_high": estimate.ci_high,
        "users": estimate.n,
    }


def markdown(result: dict) -> str:
    lines = [
        "| setting | target | V_B (truth) | estimator | mean | bias (± SE) | SD | RMSE | "
        "95% CI coverage |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        truth = result["true_value_b"][row["setting"]][row["target"]]
        half = (truth["ci_high"] - truth["ci_low"]) / 2
        lines.append(
            f"| {row['setting']} | {row['target']} | {truth['value']:.2f} ± {half:.2f} | "
            f"{row['estimator']} | {row['mean']:.2f} | {row['bias']:+.2f} ± {row['bias_se']:.2f} "
            f"| {row['sd']:.2f} | {row['rmse']:.2f} | {row['coverage']:.0%} |"
        )
    a = result["true_value_a"]
    lines.append("")
    lines.append(
        "V_A (truth, A's world): "
        + ", ".join(
            f"{t} {v['value']:.2f} ± {(v['ci_high'] - v['ci_low']) / 2:.2f}" for t, v in a.items()
        )
        + f". {result['rows'][0]['datasets']} datasets; {result['seconds']} s."
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    run_script(main)
