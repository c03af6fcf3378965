"""A short FedSlate comparison for ``make demo`` (a few minutes on 2 cores).

:func:`run_demo` trains SlateQ, FedSlate and random at (N, n) = (10, 3) on the built-in
multi-platform env (platform A with feedback, B without) for a few hundred episodes with one seed,
with a shortened burn-in and epsilon schedule so that learning starts within the demo, then prints
the per-platform ``fedrec eval`` table and writes the learning-curve plot. It is a smoke
comparison, not the paper's experiment (``fedrec bench fedslate`` runs that).
"""

from __future__ import annotations

from pathlib import Path

from fedrec.experiments.fedslate import print_table, run_dirs

#: Shortened schedule: burn-in of 1,000 transitions and epsilon below 0.1 after ~15k.
DEMO_AGENT_KWARGS = {"learning_starts": 1_000, "epsilon_decay": 0.99985}


def run_demo(
    out: Path | str = "runs/demo_fedslate",
    *,
    episodes: int = 400,
    methods: tuple[str, ...] = ("slateq", "fedslate", "random"),
) -> int:
    """Train, print the table and write ``out/learning_curves.png``; returns 0."""
    out = Path(out)
    paths = run_dirs(
        "10x3",
        seeds=1,
        episodes=episodes,
        methods=methods,
        out=out,
        eval_episodes=200,
        planner=True,
        progress=False,
        agent_kwargs=DEMO_AGENT_KWARGS,
    )
    return print_table(paths, "10x3", plot=out / "learning_curves.png")


if __name__ == "__main__":
    raise SystemExit(run_demo())
