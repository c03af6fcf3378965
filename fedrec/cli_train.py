"""``fedrec train AGENT --env ID ...``: train any agent on any registered env, with resume.

One command path for every agent: on a Gymnasium env AGENT is a single-platform slate agent
(:class:`fedrec.train.loop.SlateTrainer`), on the multi-platform env a multi-platform agent
(:class:`fedrec.train.multi_platform.MultiPlatformTrainer`); both write the same run directory
and read back with ``fedrec eval``. The agent's hyperparameters become options generated from
its ``Config`` dataclass, so ``fedrec train slateq --help`` lists SlateQ's, and an agent in a
researcher's own file (``fedrec train my_agent.py:MyAgent``) gets its options the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedrec.agents.registry import (
    AGENTS,
    MULTI_PLATFORM_AGENTS,
    OFFLINE_AGENTS,
    config_from_json,
    is_multi_platform_agent,
    make_config,
    resolve_agent,
    resolve_multi_platform_agent,
)
from fedrec.cli_parser import UsageError
from fedrec.experiments.harness import key_value as env_kwarg

DESCRIPTION = """Train AGENT on a registered environment and write the run directory
(config.json, episodes.csv, checkpoint.pt, final_eval.json). AGENT is a built-in name or
module:Class or path/to/file.py:Class: on a Gymnasium env a single-platform agent ({names}; from a logged dataset with --dataset: {offline}), on
fedrec/ChocKaleMultiPlatform-v0 a multi-platform one ({multi}). fedrec train AGENT --env ID
--help lists the agent's hyperparameters; read runs with fedrec eval RUN_DIR...; evaluate the
trained agent on another env with fedrec evaluate RUN_DIR --env ID. Duration depends on the
agent and the budget: on 2 cores SlateQ takes about 4-6 min for 5,000 episodes at (N, n) =
(100, 10), rule_search under a minute for 20,000 episodes; a progress bar shows the ETA."""


def _description() -> str:
    return DESCRIPTION.format(
        names=", ".join(AGENTS),
        offline=", ".join(OFFLINE_AGENTS),
        multi=", ".join(MULTI_PLATFORM_AGENTS),
    )


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train an agent on an environment (resumable)",
        description=_description(),
        add_help=False,
        prefix_chars="+",  # every option goes to the agent-specific parser, --help included
    )
    parser.add_argument("agent", nargs="?", metavar="AGENT")
    parser.add_argument("options", nargs=argparse.REMAINDER)
    parser.set_defaults(handler=run, train_parser=parser)


def _field_type(field: dataclasses.Field, hints: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    hint = hints[field.name]
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        return type(choices[0]), {"choices": choices}
    if origin is tuple:  # tuple[T, ...]: one or more values of T
        element = next((arg for arg in typing.get_args(hint) if arg is not Ellipsis), int)
        return element, {"nargs": "+"}
    if hint is bool:
        return None, {"action": argparse.BooleanOptionalAction}
    return hint, {}


def build_parser(
    agent_cls: type | None, agent_name: str | None, *, presets: tuple[str, ...] = ()
) -> argparse.ArgumentParser:
    """The full ``fedrec train`` parser: run options plus the agent's hyperparameters (without
    the ones a built-in name presets). Its usage errors are one line (:mod:`fedrec.cli_parser`)."""
    from fedrec.cli_parser import ArgumentParser

    parser = ArgumentParser(
        prog=f"fedrec train {agent_name or 'AGENT'}",
        description=_description(),
    )
    run = parser.add_argument_group("run")
    run.add_argument(
        "--env",
        metavar="ID",
        help="registered env id, e.g. fedrec/ChocKaleSlate-v0 (required, except with --dataset)",
    )
    run.add_argument(
        "--dataset",
        type=Path,
        metavar="PATH",
        help="offline agents (bc, cql_slateq): learn from this dataset of `fedrec data collect` "
        "(OUT/<dataset id>); --env defaults to its env, --steps counts gradient steps (default "
        "5000) and --checkpoint-every gradient steps (docs/offline.md)",
    )
    length = run.add_mutually_exclusive_group()
    length.add_argument("--episodes", type=int, help="training episodes (default 5000)")
    length.add_argument("--steps", type=int, help="or training transitions (user-steps)")
    run.add_argument(
        "--num-envs",
        type=int,
        default=16,
        help="users simulated in parallel (default 16; on the multi-platform env: users)",
    )
    run.add_argument("--seed", type=int, default=0, help="seed of env and agent (default 0)")
    run.add_argument("--out", type=Path, help="run directory (default runs/AGENT-ENV-seedS)")
    run.add_argument("--resume", action="store_true", help="continue a killed run in --out exactly")
    run.add_argument(
        "--checkpoint-every",
        type=int,
        default=500,
        help="episodes between checkpoints (default 500; 0: only at the end, and none at all "
        "for an env that cannot save its state as data, e.g. a Gymnasium env without "
        "state_dict(), which then cannot be resumed)",
    )
    run.add_argument(
        "--eval-episodes",
        type=int,
        default=500,
        help="held-out greedy evaluation episodes (default 500; 0 skips)",
    )
    run.add_argument(
        "--no-references", action="store_true", help="skip evaluating random/myopic/planner"
    )
    run.add_argument(
        "--env-kwarg", action="append", type=env_kwarg, default=[], metavar="KEY=VALUE",
        help="env keyword argument, repeatable, e.g. --env-kwarg num_candidates=100",
    )  # fmt: skip
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument(
        "--parties",
        choices=("in-process", "processes"),
        default="in-process",
        help="FedSlate's federated methods: run the server and each platform in its own process, "
        "messages over gRPC on loopback (same results; default in-process)",
    )
    run.add_argument(
        "--tls-cert",
        type=Path,
        metavar="FILE",
        help="with --parties processes: serve the parties' gRPC with TLS, presenting this PEM "
        "certificate (and trusting it; it must name 127.0.0.1); needs --tls-key",
    )
    run.add_argument(
        "--tls-key",
        type=Path,
        metavar="FILE",
        help="with --parties processes: the PEM private key of --tls-cert",
    )
    if agent_cls is not None:
        group = parser.add_argument_group(f"{agent_name} hyperparameters")
        hints = typing.get_type_hints(agent_cls.Config)
        for field in dataclasses.fields(agent_cls.Config):
            if field.name in presets:
                continue
            kind, extra = _field_type(field, hints)
            default = field.default
            text = field.metadata.get("help", "")
            flag = "--" + field.name.replace("_", "-")
            if kind is not None:
                extra["type"] = kind
            allowed = ", ".join(str(c) for c in extra.get("choices", ()))
            group.add_argument(
                flag,
                dest=f"hp_{field.name}",
                metavar=field.name.upper(),
                default=None,
                help=f"{text} ({f'one of: {allowed}; ' if allowed else ''}default {default!r})",
                **extra,
            )
    return parser


def _env_option(options: list[str]) -> str | None:
    from fedrec.cli_parser import ArgumentParser

    probe = ArgumentParser(prog="fedrec train", add_help=False)
    probe.add_argument("--env")
    known, _ = probe.parse_known_args(options)
    return known.env


def run(args: argparse.Namespace) -> int:
    from fedrec.registration import is_multi_platform

    options = list(args.options)
    if args.agent is None or args.agent in ("-h", "--help"):
        build_parser(None, None).print_help()
        return 0 if args.agent else 2
    env_id = _env_option(options)
    try:
        multi = is_multi_platform(env_id) if env_id else is_multi_platform_agent(args.agent)
        presets: dict[str, Any] = {}
        if multi:
            agent_cls, presets = resolve_multi_platform_agent(args.agent)
        else:
            agent_cls = resolve_agent(args.agent)
    except ImportError as error:  # the user's agent module (or one it imports) is not there
        raise ValueError(f"cannot import agent {args.agent!r}: {error}") from error
    parsed = build_parser(agent_cls, args.agent, presets=tuple(presets)).parse_args(options)
    _check_tls(parsed)
    overrides = {
        name[3:]: value
        for name, value in vars(parsed).items()
        if name.startswith("hp_") and value is not None
    }
    overrides = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}
    if parsed.dataset is not None or getattr(agent_cls, "offline", False):
        if parsed.parties != "in-process":  # refused, not ignored: offline agents have no parties
            raise ValueError(
                f"--parties {parsed.parties}: offline training ({args.agent!r} from a dataset) "
                "runs in one process; drop --parties"
            )
        from fedrec.cli_offline import train_offline_command

        return train_offline_command(args.agent, agent_cls, overrides, parsed)
    if parsed.env is None:
        raise UsageError(
            f"fedrec train {args.agent}", "the following arguments are required: --env"
        )
    env_tag = parsed.env.split("/")[-1]
    agent_tag = args.agent.rpartition(":")[2]  # a built-in name, or the class of a path
    out = parsed.out or Path("runs") / f"{agent_tag}-{env_tag}-seed{parsed.seed}"
    agent_config = make_config(agent_cls, {**presets, **overrides})
    if parsed.resume and not overrides and (out / "config.json").is_file():
        saved = _read_saved_config(out / "config.json")
        saved_agent = saved.get("agent_config") or {}
        if not isinstance(saved_agent, dict):
            raise ValueError(f"--resume: {out / 'config.json'}: agent_config is not an object")
        agent_config = config_from_json(agent_cls, saved_agent)
    if parsed.parties != "in-process":
        from fedrec.agents.fedslate import FedSlateAgent

        if not (multi and issubclass(agent_cls, FedSlateAgent) and agent_config.federated):
            raise ValueError(
                f"--parties {parsed.parties}: only FedSlate's federated methods (fedslate, "
                f"fedslate_exp, fedq and their variants) run their parties in processes, "
                f"not {args.agent!r}"
            )
    if multi:
        return _train_multi_platform(args.agent, agent_cls, agent_config, parsed, out)
    return _train_slate(args.agent, agent_cls, agent_config, parsed, out)


def _check_tls(parsed: argparse.Namespace) -> None:
    """``--tls-cert`` and ``--tls-key``: both or neither, only with ``--parties processes``, and
    readable files (checked before anything starts). They are not part of the run's setup:
    ``config.json`` records neither, so a resumed run may use new certificate files."""
    cert, key = parsed.tls_cert, parsed.tls_key
    if cert is None and key is None:
        return
    if cert is None or key is None:
        given, missing = ("--tls-cert", "--tls-key") if key is None else ("--tls-key", "--tls-cert")
        raise ValueError(f"{given} needs {missing}: give the certificate and its private key")
    if parsed.parties != "processes":
        raise ValueError(
            "--tls-cert/--tls-key: TLS is for the parties' gRPC; add --parties processes"
        )
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        if not path.exists():
            raise ValueError(f"{flag}: {path} does not exist")
        if not path.is_file():
            raise ValueError(f"{flag}: {path} is not a file")
        try:
            with path.open("rb"):
                pass
        except OSError as error:
            raise ValueError(f"{flag}: cannot read {path} ({error.strerror})") from error


def _read_saved_config(path: Path) -> dict[str, Any]:
    """A run's ``config.json`` for ``--resume`` (a malformed one is a one-line error)."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"--resume: {path} is not valid JSON ({error})") from error
    if not isinstance(saved, dict):
        raise ValueError(f"--resume: {path} is not a JSON object")
    return saved


def _mean_ci(summary: Mapping[str, Any]) -> str:
    """``mean ± half-width``: 4 decimals for metrics in [0, 1] (hit rates), 1 for returns."""
    returns = summary.get("returns") or []
    digits = 4 if returns and all(0.0 <= r <= 1.0 for r in returns) else 1
    return f"{summary['mean']:.{digits}f} ± {summary['half_width']:.{digits}f}"


def _train_slate(name: str, agent_cls: type, agent_config: Any, parsed: Any, out: Path) -> int:
    from fedrec.train.loop import TrainConfig, train

    episodes = parsed.episodes if parsed.episodes is not None or parsed.steps else 5000
    config = TrainConfig(
        env_id=parsed.env,
        episodes=episodes,
        steps=parsed.steps,
        num_envs=parsed.num_envs,
        seed=parsed.seed,
        env_kwargs=dict(parsed.env_kwarg),
        checkpoint_every=parsed.checkpoint_every,
        eval_episodes=parsed.eval_episodes,
        references=not parsed.no_references,
        progress=not parsed.no_progress,
    )

    def factory(env: Any) -> Any:
        return agent_cls.from_env(env, config=agent_config, seed=parsed.seed)

    result = train(
        factory, config=config, out_dir=out, resume=parsed.resume, run_info={"agent": name}
    )
    returns = result.returns
    print(
        f"{len(returns)} episodes, {result.steps} steps in {result.wall_time:.1f} s; "
        f"mean return of the last 100: {returns[-100:].mean():.1f}",
        file=sys.stdout,
    )
    if result.final_eval is not None:
        for policy, summary in result.final_eval["policies"].items():
            print(f"  greedy evaluation, {policy:8s} {_mean_ci(summary)}")
    print(f"run written to {out}; read it with: fedrec eval {out}")
    return 0


def _train_multi_platform(
    name: str, agent_cls: type, agent_config: Any, parsed: Any, out: Path
) -> int:
    from fedrec.train.multi_platform import MultiPlatformTrainConfig, train_multi_platform

    if parsed.steps is not None:
        raise ValueError("--steps: multi-platform runs are measured in episodes (use --episodes)")
    config = MultiPlatformTrainConfig(
        method=name,
        episodes=parsed.episodes if parsed.episodes is not None else 5000,
        num_users=parsed.num_envs,
        seed=parsed.seed,
        env_kwargs=dict(parsed.env_kwarg),
        checkpoint_every=parsed.checkpoint_every,
        eval_episodes=parsed.eval_episodes,
        planner=not parsed.no_references,
        progress=not parsed.no_progress,
        env_id=parsed.env,
    )

    built: list[Any] = []
    remote: dict[str, Any] = {}
    if parsed.parties != "in-process":
        remote["parties"] = parsed.parties
    if parsed.tls_cert is not None:  # not in config.json: a resumed run may use new files
        from fedrec.federation.grpc_auth import TLSFiles

        remote["tls"] = TLSFiles(
            cert_file=str(parsed.tls_cert.resolve()), key_file=str(parsed.tls_key.resolve())
        )

    def factory(env: Any) -> Any:
        built.append(agent_cls.from_env(env, config=agent_config, seed=parsed.seed, **remote))
        return built[-1]

    try:
        result = train_multi_platform(config, out_dir=out, resume=parsed.resume, agent=factory)
    finally:
        for agent in built:  # stops the party processes of --parties processes
            getattr(agent, "close", lambda: None)()
    episodes = len(next(iter(result.returns.values())))
    means = ", ".join(f"{p} {v[-100:].mean():.1f}" for p, v in result.returns.items())
    print(
        f"{episodes} episodes, {result.steps} steps in {result.wall_time:.1f} s; "
        f"mean return of the last 100: {means}"
    )
    if result.final_eval is not None:
        for policy, platforms in result.final_eval["policies"].items():
            cells = ", ".join(f"{p} {_mean_ci(s)}" for p, s in platforms.items())
            print(f"  greedy evaluation, {policy:8s} {cells}")
    print(f"run written to {out}; read it with: fedrec eval {out}")
    return 0
