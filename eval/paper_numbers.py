"""The FedSlate paper's reported numbers, as data, so tables can print "paper" columns beside ours.

Source: the FedSlate paper's results, listed in ``docs/fedslate.md``, "The paper's reported
numbers". The paper's metrics (same section) are the maximum of a 20-episode-logged, 100-episode
moving average of training returns ("optimal reward") and the first logged episode at which that
curve reaches it (ETROR); ``docs/metrics.md`` defines how fedrec computes them.

Settings are written ``"NxN_slate"``: ``"100x10"`` is N=100 candidates and slates of n=10. Platform
``"alpha"`` is the platform with feedback (our ``platform_a``), ``"beta"`` the one without
(``platform_b``). A ``setting`` or ``platform`` of ``None`` means the paper does not tie the number
to one (or does not say which).

Matching (:func:`paper_reference`): a number applies to a run's return series when its algorithm
is the run's agent (lower case, a trailing ``Agent`` dropped: ``SlateQAgent`` is ``slateq``) (``"random"`` numbers apply to every agent), its scenario is the requested one
(``"basic"`` unless asked otherwise), and its setting and platform are equal to the run's or
``None``. A single-platform series (column ``return``) counts as platform ``"alpha"``: a platform
that observes its own feedback. The joint return of a multi-platform run (``return/joint``, the
sum over platforms) matches nothing: the paper reports no joint numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedrec.eval.curves import JOINT_SERIES

Metric = Literal["etror", "optimal_reward", "random_mean", "mean_reward"]

#: Where the numbers come from (printed under tables that show them).
SOURCE = "the FedSlate paper, as listed in docs/fedslate.md ('The paper's reported numbers')"

#: The (N, n) settings the paper reports, as ``"NxN_slate"``.
SETTINGS = ("10x3", "100x10", "500x10")
#: ``fedrec eval --paper``'s choices: pick the setting from the runs, none, or one by name.
PAPER_CHOICES = ("auto", "none", *SETTINGS)


@dataclass(frozen=True)
class PaperNumber:
    """One reported number. ``value`` None means "did not converge" (no number exists).

    ``upper`` is set for a reported range ``value``–``upper`` (the five-platform results).
    """

    metric: Metric
    algorithm: str
    value: float | None
    setting: str | None = None
    platform: str | None = None
    scenario: str = "basic"
    upper: float | None = None
    note: str = ""

    def __str__(self) -> str:
        if self.value is None:
            return "not conv."
        text = f"{self.value:g}" if self.metric == "etror" else f"{self.value:.1f}"
        if self.upper is not None:
            text += f"–{self.upper:.1f}"
        return text


FEDSLATE_PAPER: tuple[PaperNumber, ...] = (
    # ETROR (episodes, lower is better); the platform is not stated.
    PaperNumber("etror", "slateq", 3400, setting="100x10"),
    PaperNumber("etror", "fedslate", 2340, setting="100x10"),
    PaperNumber("etror", "slateq", 2020, setting="500x10"),
    PaperNumber("etror", "fedslate", 1700, setting="500x10"),
    PaperNumber("etror", "slateq", None, setting="10x3", note="neither converged"),
    PaperNumber("etror", "fedslate", None, setting="10x3", note="neither converged"),
    # Alpha platform optimal reward (setting not stated).
    PaperNumber("optimal_reward", "fedslate", 1106.57, platform="alpha"),
    PaperNumber("optimal_reward", "slateq", 1115.07, platform="alpha"),
    # Beta platform: FedSlate's optimal reward and the random policy's mean, per setting.
    PaperNumber("optimal_reward", "fedslate", 1115.281, setting="10x3", platform="beta"),
    PaperNumber("optimal_reward", "fedslate", 1102.269, setting="100x10", platform="beta"),
    PaperNumber("optimal_reward", "fedslate", 1129.96, setting="500x10", platform="beta"),
    PaperNumber("random_mean", "random", 948.294, setting="10x3", platform="beta"),
    PaperNumber("random_mean", "random", 944.982, setting="100x10", platform="beta"),
    PaperNumber("random_mean", "random", 939.979, setting="500x10", platform="beta"),
    # Sparse team reward: FedSlate basic vs extended (both platforms with feedback).
    PaperNumber("etror", "fedslate", 3540, platform="alpha", scenario="sparse_team"),
    PaperNumber("etror", "fedslate", 2940, platform="beta", scenario="sparse_team"),
    PaperNumber("etror", "fedslate_exp", 2280, platform="alpha", scenario="sparse_team"),
    PaperNumber("etror", "fedslate_exp", 780, platform="beta", scenario="sparse_team"),
    PaperNumber("optimal_reward", "fedslate", 1081.422, platform="alpha", scenario="sparse_team"),
    PaperNumber("optimal_reward", "fedslate", 1042.926, platform="beta", scenario="sparse_team"),
    PaperNumber(
        "optimal_reward", "fedslate_exp", 1091.515, platform="alpha", scenario="sparse_team"
    ),
    PaperNumber(
        "optimal_reward", "fedslate_exp", 1108.855, platform="beta", scenario="sparse_team"
    ),
    # Five platforms: range of the per-platform mean rewards.
    PaperNumber("mean_reward", "fedslate", 1177.76, upper=1196.26, scenario="five_platforms"),
    PaperNumber("mean_reward", "baseline", 1155.97, upper=1185.04, scenario="five_platforms"),
)


def platform_of_series(series: str) -> str:
    """The paper's platform name for a return column: ``return/platform_b`` -> ``"beta"``.

    ``return`` (single platform, with feedback) and ``return/platform_a`` are ``"alpha"``; other
    platform names are returned unchanged (``return/platform_c`` -> ``"platform_c"``).
    """
    platform = series.removeprefix("return").removeprefix("/") or "platform_a"
    return {"platform_a": "alpha", "platform_b": "beta"}.get(platform, platform)


def setting_of(env_id: str, env_kwargs: dict | None) -> str | None:
    """The paper setting ``"NxN_slate"`` of a Choc-vs-Kale run (env defaults 10 and 3), else None."""
    if "ChocKale" not in env_id:
        return None
    kwargs = env_kwargs or {}
    return f"{int(kwargs.get('num_candidates', 10))}x{int(kwargs.get('slate_size', 3))}"


#: The parity configurations (the official code's settings) compare with the paper's FedSlate:
#: the official repository's only (100, 10) script runs the FedSlate(exp) variant, so its
#: (100, 10) numbers are the ones the paper reports for FedSlate.
PARITY_ALGORITHMS = {"fedslate_official": "fedslate", "fedslate_exp_official": "fedslate"}


def algorithm_name(agent: str) -> str:
    """The paper's name for a config ``agent``: ``"SlateQAgent"`` / ``"slateq"`` -> ``"slateq"``;
    a parity configuration (``fedslate_official``) -> ``"fedslate"``."""
    name = agent.lower().replace("-", "_")
    name = name.removesuffix("agent").rstrip("_") or name
    return PARITY_ALGORITHMS.get(name, name)


def paper_reference(
    *,
    algorithm: str,
    setting: str | None,
    series: str = "return",
    scenario: str = "basic",
) -> dict[Metric, PaperNumber]:
    """The paper numbers matching a run's agent, setting and return series, by metric.

    The most specific match wins (a number tied to the setting and platform over an untied one).
    ``random_mean`` numbers match any algorithm. The joint series ``return/joint`` matches none.
    """
    if series == JOINT_SERIES:
        return {}
    algorithm = algorithm_name(algorithm)
    platform = platform_of_series(series)
    best: dict[Metric, tuple[int, PaperNumber]] = {}
    for number in FEDSLATE_PAPER:
        if number.scenario != scenario:
            continue
        if number.algorithm not in (algorithm, "random" if number.metric == "random_mean" else ""):
            continue
        if number.setting not in (None, setting) or number.platform not in (None, platform):
            continue
        specificity = (number.setting is not None) + (number.platform is not None)
        if number.metric not in best or specificity > best[number.metric][0]:
            best[number.metric] = (specificity, number)
    return {metric: number for metric, (_, number) in best.items()}
