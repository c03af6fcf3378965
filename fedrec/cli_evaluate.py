"""``fedrec evaluate RUN_DIR --env ID``: evaluate a trained run's agent, without training.

The agent is rebuilt from the run directory with its trained weights
(:func:`fedrec.train.load_trained_agent`: safe loading, no code from the run's files) and
evaluated greedily on held-out episodes of ``--env`` (default: the env it trained on), beside
the reference policies, as mean ± 95% CI. An env whose observation or slate spaces do not fit
the agent is refused in one line before anything runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fedrec.experiments.harness import key_value

DESCRIPTION = (
    "Evaluate the trained agent of RUN_DIR (a run directory of fedrec train or fedrec bench "
    "fedslate) greedily on held-out episodes of --env, beside the reference policies (random, "
    "and on the Choc-vs-Kale envs myopic, the planner and the fixed heuristics), as mean ± 95% "
    "CI over episodes; nothing is trained and the run directory is not changed. The agent keeps "
    "its weights; the env must have the same observation and slate spaces as the one it trained "
    "on (else a one-line error). Duration with the default 500 episodes on a free core: about "
    "6 s for a single-platform run and 10 s for a multi-platform one, most of it the planner "
    "(--no-references skips it); longer on a busy machine."
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="evaluate a trained run's agent on an env (no training)",
        description=DESCRIPTION,
    )
    parser.add_argument("run", metavar="RUN_DIR", type=Path, help="the run directory")
    parser.add_argument(
        "--env",
        metavar="ID",
        help="registered env id to evaluate on (default: the env the run trained on)",
    )
    parser.add_argument(
        "--env-kwarg", action="append", type=key_value, default=[], metavar="KEY=VALUE",
        help="env keyword argument, repeatable (default: the run's own when --env is its env, "
        "else none)",
    )  # fmt: skip
    parser.add_argument(
        "--agent-file",
        action="append",
        default=[],
        metavar="PATH.py:CLASS",
        help="the agent file the run was trained with, when it is your own file (a run "
        "directory never chooses code to run: it must be named here); repeatable (default: "
        "none, built-in agents need none)",
    )
    parser.add_argument(
        "--episodes", type=int, default=500, help="held-out evaluation episodes (default 500)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the held-out episodes (default: the run's seed, i.e. the episodes of its "
        "final evaluation)",
    )
    parser.add_argument(
        "--no-references",
        action="store_true",
        help="skip the slow references (single-platform: every reference policy; "
        "multi-platform: the planner, myopic and the belief planner). Default: all of them",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the evaluation as JSON (default: a table)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fedrec.train.trained import check_agent_files, load_trained_agent, read_run

    if args.episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {args.episodes}")
    trained = read_run(args.run)
    check_agent_files(trained, args.agent_file)  # before anything is imported
    env_id = args.env or trained.env_id
    kwargs = dict(trained.env_kwargs) if env_id == trained.env_id else {}
    kwargs.update(dict(args.env_kwarg))
    seed = trained.seed if args.seed is None else args.seed
    check_fits(trained, env_id, kwargs)
    agent = load_trained_agent(args.run, agent_files=args.agent_file)
    if trained.multi_platform:
        result = _evaluate_multi_platform(agent, trained, env_id, kwargs, seed, args)
    else:
        from fedrec.train.loop import TrainConfig, final_evaluation

        config = TrainConfig(
            env_id,
            num_envs=1,
            seed=seed,
            env_kwargs=kwargs,
            eval_episodes=args.episodes,
            references=not args.no_references,
        )
        result = final_evaluation(agent, config=config)
    result = {"run": str(args.run), "env_id": env_id, "env_kwargs": kwargs, **result}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    _print_table(result, trained)
    return 0


def _evaluate_multi_platform(
    agent: Any, trained: Any, env_id: str, kwargs: dict[str, Any], seed: int, args: Any
) -> dict[str, Any]:
    from fedrec.train.multi_platform import (
        MultiPlatformTrainConfig,
        final_evaluation,
        make_env,
    )
    from fedrec.train.trained import prepare_multi_platform_agent

    config = MultiPlatformTrainConfig(
        method=trained.agent,
        num_users=1,
        seed=seed,
        env_kwargs=kwargs,
        eval_episodes=args.episodes,
        planner=not args.no_references,
        env_id=env_id,
    )
    prepare_multi_platform_agent(agent, make_env(config, 1))  # what the method REQUIRES
    return final_evaluation(agent, config=config)


def _spaces(env_id: str, kwargs: dict[str, Any], multi: bool) -> dict[str, Any]:
    """The spaces an agent of ``env_id`` acts in (per platform on a multi-platform env)."""
    if multi:
        from fedrec.train.multi_platform import MultiPlatformTrainConfig, make_env

        env = make_env(MultiPlatformTrainConfig(env_id=env_id, env_kwargs=kwargs), 1)
        return {
            f"{p} {what}": space
            for p in env.possible_agents
            for what, space in (
                ("observation", env.observation_spaces[p]),
                ("slate", env.action_spaces[p]),
            )
        }
    import gymnasium as gym

    from fedrec.train.core import env_kwargs_errors

    try:
        with env_kwargs_errors(env_id, kwargs):
            env = gym.make(env_id, **kwargs)
    except gym.error.Error as error:
        raise ValueError(f"cannot build {env_id!r}: {error}") from error
    try:
        return {"observation": env.observation_space, "slate": env.action_space}
    finally:
        env.close()


def check_fits(trained: Any, env_id: str, kwargs: dict[str, Any]) -> None:
    """Refuse an env of the other kind, or one whose spaces differ from the run's env's."""
    from fedrec.registration import entry_of, is_multi_platform

    entry_of(env_id)  # an unknown id: one line naming the known ones
    if is_multi_platform(env_id) != trained.multi_platform:
        kind = "multi-platform" if trained.multi_platform else "single-platform"
        raise ValueError(
            f"{trained.path} holds a {kind} agent ({trained.agent}); {env_id} is not a {kind} env"
        )
    theirs = _spaces(trained.env_id, trained.env_kwargs, trained.multi_platform)
    ours = _spaces(env_id, kwargs, trained.multi_platform)
    for key in sorted(set(theirs) | set(ours)):
        if theirs.get(key) != ours.get(key):
            where, mine, trained_with = _difference(key, ours.get(key), theirs.get(key))
            raise ValueError(
                f"{env_id} does not fit the agent of {trained.path}: its {where} is {mine}, "
                f"the agent was trained on {trained.env_id} with {trained_with} (the same "
                "candidates, slate size and platforms are needed)"
            )


def _difference(key: str, ours: Any, theirs: Any) -> tuple[str, Any, Any]:
    """Where two spaces differ: the first differing entry of two Dict spaces, else the whole."""
    from gymnasium import spaces

    if isinstance(ours, spaces.Dict) and isinstance(theirs, spaces.Dict):
        for name in sorted(set(ours.spaces) | set(theirs.spaces)):
            a, b = ours.spaces.get(name, "absent"), theirs.spaces.get(name, "absent")
            if a != b:
                return f"{key} space's {name!r}", a, b
    return f"{key} space", ours, theirs


def _print_table(result: dict[str, Any], trained: Any) -> None:
    from fedrec.cli_train import _mean_ci

    kwargs = ", ".join(f"{k}={v}" for k, v in result["env_kwargs"].items())
    print(
        f"{trained.agent} from {trained.path} on {result['env_id']}"
        f"{f' ({kwargs})' if kwargs else ''}: {result['episodes']} held-out episodes "
        f"(seed {result['seed']}), mean return ± 95% CI"
    )
    policies = result["policies"]
    width = max(len(name) for name in policies)
    for name, summary in policies.items():
        if "mean" in summary:  # single-platform
            cells = _mean_ci(summary)
        else:
            cells = ", ".join(f"{p} {_mean_ci(s)}" for p, s in summary.items())
        print(f"  {name:{width}s}  {cells}")
