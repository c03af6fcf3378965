"""FedCEM's privacy, measured: how well platform B infers A's elite, and what DP costs.

Usage: ``python benchmarks/fedcem_privacy.py [--episodes 10000] [--seeds 0 1 2]
[--epsilons 8 1] [--dp-population 1024] [--out DIR] [--overwrite]``: writes ``privacy.json`` and
``privacy.md`` into ``--out`` (default ``runs/benchmarks/fedcem_privacy/``; an earlier run's files
are replaced only with ``--overwrite``). The defaults with ``--out results/fedcem_privacy`` wrote
the committed ``results/fedcem_privacy/{privacy.json,privacy.md}``.

The attack (:mod:`fedrec.eval.elite_inference`) scores each of a population's rule draws by how
likely it was in the feedback platform's elite (its best quarter of episode returns), from what
B receives: the draws and the broadcast rule before and after the update. It is scored by the
ROC AUC against the true elite (0.5: chance), per update, averaged over a run's updates.

1. **Synthetic regimes** (FedCEM's own code, channel and protection; no env): returns that
   depend only on the user (one N(0, 1) value per user-episode, whatever its rule) and returns
   that depend only on the rule (theta . w, w a fixed random unit vector). Also two feedback
   platforms (A1, A2) and B, where ``secure_sum`` can run: B's AUC for A1's elite. Each
   setting runs as many updates as its env run.
2. **The env**: real FedCEM training on ``fedrec/ChocKaleMultiPlatform-v0`` in the long-term
   setting of ``fedrec bench fedslate --setting longterm`` (100 candidates, slates of 10,
   sensitivity 0.05; A with feedback, B without), 16 users per batch, with the audit reading
   B's channel deliveries. The final greedy rule is evaluated on 500 held-out user-episodes (the
   same episodes for every setting of a seed), as ``fedrec train`` does.

Settings: ``none`` (FedCEM, population 256), ``none`` at the DP population (the same search
without noise: what the larger population alone costs and hides), and ``dp`` at each target
epsilon: the noise multiplier is calibrated (Opacus's RDP accountant,
:func:`fedrec.federation.privacy.noise_multiplier_for`) so that the run's T updates compose to
epsilon at delta = 1e-5, and the agent's own accounting (:meth:`FedCEMAgent.privacy`) is
reported.

Runtime: about 40 s per env run on one core (12 runs at the defaults) plus a few seconds of
synthetic runs. The docs' FedCEM runs train 20,000 episodes; 10,000 here keeps the benchmark
under 15 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from fedrec.agents.registry import build_multi_platform_agent
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv
from fedrec.eval.elite_inference import METHODS, EliteAudit, play_population
from fedrec.eval.stats import mean_ci
from fedrec.experiments.harness import add_out_arguments, claim_outputs, run_script, script_out
from fedrec.federation.privacy import noise_multiplier_for
from fedrec.registration import LONG_TERM_KWARGS
from fedrec.train.multi_platform import MultiPlatformTrainConfig, train_multi_platform

USERS = 16
DELTA = 1e-5
ENV_KWARGS = {
    "num_candidates": 100,
    "slate_size": 10,
    "sensitivity": LONG_TERM_KWARGS["sensitivity"],
}


def updates_of(episodes: int, population: int) -> int:
    """Search updates in a run of ``episodes`` user-episodes (batches of :data:`USERS`)."""
    return (-(-episodes // USERS) * USERS) // population


def settings(
    episodes: int, epsilons: list[float], dp_population: int
) -> list[tuple[str, dict[str, Any]]]:
    """(label, FedCEM config overrides) per setting; DP noise calibrated to the run's updates."""
    updates = updates_of(episodes, dp_population)
    out = [("none", {}), (f"none, population {dp_population}", {"population": dp_population})]
    for target in epsilons:
        z = noise_multiplier_for(target, DELTA, 1.0, updates)
        out.append(
            (
                f"dp, epsilon {target:g}",
                {
                    "protection": "dp",
                    "population": dp_population,
                    "noise_multiplier": round(z, 3),
                    "delta": DELTA,
                },
            )
        )
    return out


def summary(audit: EliteAudit) -> dict[str, Any]:
    results = audit.results()
    return {
        "updates": len(results),
        **{f"auc_{m}": float(np.mean([r.auc[m] for r in results])) for m in METHODS},
        "auc_least_squares_per_update": [round(r.auc["least_squares"], 4) for r in results],
    }


def synthetic(
    setting: dict[str, Any], regime: str, seed: int, updates: int, *, two_feedback: bool = False
) -> dict[str, Any]:
    """The attack's AUC on ``updates`` populations of synthetic returns (see the module doc)."""
    env_kwargs = dict(ENV_KWARGS)
    if two_feedback:
        env_kwargs |= {"num_platforms": 3, "feedback": [True, True, False]}
    env = ChocKaleMultiPlatformBatchEnv(USERS, **env_kwargs)
    agent = build_multi_platform_agent("fedcem", env, seed=seed, **setting)
    audit = EliteAudit(agent, victim="platform_a")
    rng = np.random.default_rng(1000 + seed)
    w = rng.normal(size=agent.config.size)
    w /= np.linalg.norm(w)
    returns: Callable[[np.ndarray], np.ndarray]
    if regime == "user":
        returns = lambda draws: rng.normal(size=len(draws))  # noqa: E731
    else:
        returns = lambda draws: draws @ w  # noqa: E731
    for _ in range(updates):
        play_population(agent, returns, users=USERS)
    privacy = agent.privacy()
    return {**summary(audit), "epsilon": privacy["epsilon"] if privacy else None}


def env_run(setting: dict[str, Any], seed: int, episodes: int) -> dict[str, Any]:
    """Train FedCEM on the long-term multi-platform env with the audit attached."""
    audits: list[EliteAudit] = []

    def factory(env: Any) -> Any:
        agent = build_multi_platform_agent("fedcem", env, seed=seed, **setting)
        audits.append(EliteAudit(agent))
        return agent

    config = MultiPlatformTrainConfig(
        method="fedcem",
        episodes=episodes,
        num_users=USERS,
        seed=seed,
        env_kwargs=ENV_KWARGS,
        eval_episodes=500,
        planner=False,
        progress=False,
        checkpoint_every=0,
    )
    start = time.perf_counter()
    result = train_multi_platform(config, agent=factory)
    seconds = time.perf_counter() - start
    (audit,) = audits
    policies = result.final_eval["policies"]
    returns = {
        policy: {p: round(policies[policy][p]["mean"], 2) for p in ("platform_a", "platform_b")}
        | {"joint": round(policies[policy]["total"]["mean"], 2)}
        for policy in ("agent", "random", "bottom_x", "top_x")
    }
    return {
        **summary(audit),
        "privacy": audit.agent.privacy(),
        "returns": returns,
        "seconds": round(seconds, 1),
    }


def ci(values: list[float], digits: int = 3) -> str:
    centre, half = mean_ci(values)
    if np.isnan(half):
        return f"{centre:.{digits}f}"
    return f"{centre:.{digits}f} ± {half:.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    seeds = report["seeds"]
    lines = [
        "# FedCEM: what B infers from the search update, and what DP costs",
        "",
        f"Command: `{report['command']}` ({report['wall_seconds']:.0f} s on {report['machine']}).",
        f"Seeds {', '.join(map(str, seeds))}; mean ± 95% t-interval over seeds. AUC: the attack's "
        "ROC AUC for the true elite (0.5: chance), least-squares score (likelihood-ratio score "
        "in brackets), averaged over a run's updates. epsilon at delta = 1e-5, composed over "
        "the run's updates (per update in brackets).",
        "",
        "## Synthetic regimes (FedCEM's code, no env)",
        "",
        "| setting | updates | returns depend only on the user | returns depend only on the rule | epsilon |",
        "|---|---|---|---|---|",
    ]
    for label, rows in report["synthetic"].items():
        user, rule = rows["user"], rows["rule"]
        eps = user[0]["epsilon"]
        lines.append(
            f"| {label} | {user[0]['updates']} "
            f"| {ci([r['auc_least_squares'] for r in user])} ({ci([r['auc_likelihood'] for r in user])}) "
            f"| {ci([r['auc_least_squares'] for r in rule])} ({ci([r['auc_likelihood'] for r in rule])}) "
            f"| {'—' if eps is None else f'{eps:.2f}'} |"
        )
    lines += [
        "",
        f"## The env: FedCEM on the long-term setting ({report['episodes']:,} episodes)",
        "",
        "| setting | noise multiplier | epsilon | updates | AUC (B's attack) | joint return | vs none | B's return | vs none |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base = report["env"]["none"]
    for label, runs in report["env"].items():
        joint = [r["returns"]["agent"]["joint"] for r in runs]
        b = [r["returns"]["agent"]["platform_b"] for r in runs]
        d_joint = [j - r["returns"]["agent"]["joint"] for j, r in zip(joint, base, strict=True)]
        d_b = [x - r["returns"]["agent"]["platform_b"] for x, r in zip(b, base, strict=True)]
        privacy = runs[0]["privacy"]
        z = f"{privacy['noise_multiplier']:g}" if privacy else "—"
        eps = f"{privacy['epsilon']:.2f} ({privacy['epsilon_per_update']:.2f})" if privacy else "∞"
        lines.append(
            f"| {label} | {z} | {eps} | {runs[0]['updates']} "
            f"| {ci([r['auc_least_squares'] for r in runs])} ({ci([r['auc_likelihood'] for r in runs])}) "
            f"| {ci(joint, 1)} | {ci(d_joint, 1) if label != 'none' else '—'} "
            f"| {ci(b, 1)} | {ci(d_b, 1) if label != 'none' else '—'} |"
        )
    ref = {
        name: ci([r["returns"][name]["joint"] for r in base], 1)
        for name in ("random", "bottom_x", "top_x")
    }
    lines += [
        "",
        f"Reference joint returns on the same held-out episodes: random {ref['random']}, "
        f"bottom-x {ref['bottom_x']}, top-x {ref['top_x']}.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[8.0, 1.0])
    parser.add_argument("--dp-population", type=int, default=1024)
    add_out_arguments(parser, "fedcem_privacy", what="folder of privacy.json and privacy.md")
    args = parser.parse_args()
    args.out = script_out("fedcem_privacy", args.out)
    claim_outputs([args.out / "privacy.json", args.out / "privacy.md"], overwrite=args.overwrite)
    start = time.perf_counter()
    table = settings(args.episodes, args.epsilons, args.dp_population)
    report: dict[str, Any] = {
        "command": "python benchmarks/fedcem_privacy.py "
        + f"--episodes {args.episodes} --seeds {' '.join(map(str, args.seeds))} "
        + f"--epsilons {' '.join(f'{e:g}' for e in args.epsilons)} "
        + f"--dp-population {args.dp_population}",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "episodes": args.episodes,
        "seeds": args.seeds,
        "users_per_batch": USERS,
        "env_kwargs": ENV_KWARGS,
        "delta": DELTA,
        "settings": dict(table),
        "synthetic": {},
        "env": {},
    }
    default = updates_of(args.episodes, 256)
    for label, setting in table:
        updates = updates_of(args.episodes, setting.get("population", 256))
        report["synthetic"][label] = {
            regime: [synthetic(setting, regime, seed, updates) for seed in args.seeds]
            for regime in ("user", "rule")
        }
        print(label, "synthetic done", flush=True)
    for label, setting in (("none", {}), ("secure_sum", {"protection": "secure_sum"})):
        report["synthetic"][f"{label}, two feedback platforms"] = {
            regime: [
                synthetic(setting, regime, seed, default, two_feedback=True) for seed in args.seeds
            ]
            for regime in ("user", "rule")
        }
    for label, setting in table:
        report["env"][label] = []
        for seed in args.seeds:
            run = env_run(setting, seed, args.episodes)
            report["env"][label].append({"seed": seed, **run})
            print(
                f"{label} seed {seed}: AUC {run['auc_least_squares']:.3f}, joint "
                f"{run['returns']['agent']['joint']:.1f}, {run['seconds']:.0f} s",
                flush=True,
            )
    report["wall_seconds"] = round(time.perf_counter() - start, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "privacy.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "privacy.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    run_script(main)
