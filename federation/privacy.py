"""DP-FedAvg aggregation and privacy accounting: FEL's leaves and ensemble, FedCEM's DP variant.

Federation-layer code (it sees client updates and the server's noise, nothing of a model): the
FEL trainer (:mod:`fedrec.train.fel`), its Flower apps and FedCEM (:mod:`fedrec.agents.fedcem`)
build on it.

**Mechanism** (McMahan et al.'s DP-FedAvg, run inside each cluster): each round the clients of a
cluster are Poisson-sampled with rate q; each sampled client's model update Δ_k is clipped to L2
norm at most S (Δ_k · min(1, S / ||Δ_k||)); the server adds Gaussian noise N(0, (z S)^2 I) to the
sum and divides by the *expected* number of sampled clients q N_c (a fixed denominator, so one
client changes the average by at most S / (q N_c)). z is the noise multiplier.
:func:`dp_aggregate` does the clip / sum / noise / divide for all clusters of a round at once.

**Accounting** is done by Opacus's RDP accountant (``opacus.accountants.RDPAccountant``), not
re-derived here: a leaf trained for T rounds is T compositions of the Poisson-subsampled Gaussian
mechanism (z, q). :func:`epsilon` gives ε for (z, q, T, δ); :func:`noise_multiplier_for` inverts
it with ``opacus.accountants.utils.get_noise_multiplier``.

**FEL's composition** (:func:`fel_epsilon`), with a user's privacy loss measured on their own
(label) data:

- *parallel*: the leaves train on disjoint clusters, so a user only pays for their own cluster's
  leaf; the ensemble's ε is the **max over clusters**, not the sum;
- *sequential*: any further mechanism that touches the same users' protected data (an over-arch
  trained with DP on their labels, a private leaf) **adds its RDP curve at every order** before
  the conversion to (ε, δ) (the accountant's history holds all of them);
- *opt-in* data (an over-arch trained only on users who agreed to central use) costs the other
  users nothing and is not passed to the accountant.

**Inputs** are checked before anything is computed (:func:`validate_dp_arguments`): a noise
multiplier is a finite number >= 0, δ is in (0, 1), a sampling rate q in (0, 1], steps an integer
>= 0, a target ε and a clip norm finite and > 0; anything else raises ``ValueError`` naming the
argument (Opacus would loop forever on z = NaN and return a negative ε for δ = 1). A client update
with NaN or inf aborts :func:`dp_aggregate`'s round with
:class:`~fedrec.federation.secagg.MalformedContribution`, as MF-SecAvg does, instead of turning
its cluster's model into NaN.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch


def _real(name: str, value: object) -> float:
    """``value`` as a float, or ``ValueError`` if it is not a finite real number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return number


def check_noise_multiplier(value: object, name: str = "noise_multiplier") -> float:
    """A noise multiplier z: a finite number >= 0 (0: no noise, ε infinite)."""
    z = _real(name, value)
    if z < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return z


def check_delta(value: object, name: str = "delta") -> float:
    """δ of an (ε, δ) guarantee: a number in (0, 1)."""
    delta = _real(name, value)
    if not 0 < delta < 1:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    return delta


def check_sample_rate(value: object, name: str = "sample_rate") -> float:
    """A Poisson sampling rate q: a number in (0, 1]."""
    q = _real(name, value)
    if not 0 < q <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return q


def check_steps(value: object, name: str = "steps", minimum: int = 0) -> int:
    """A number of rounds: an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def check_positive(value: object, name: str) -> float:
    """A finite number > 0 (a clip norm, a target ε)."""
    number = _real(name, value)
    if not number > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return number


def validate_dp_arguments(
    *,
    clip_norm: object | None = None,
    noise_multiplier: object | None = None,
    target_epsilon: object | None = None,
    delta: object | None = None,
    sample_rate: object | None = None,
    rounds: object | None = None,
) -> None:
    """Check every DP argument that is given (None: not given): ``clip_norm`` and
    ``target_epsilon`` finite and > 0, ``noise_multiplier`` finite and >= 0, ``delta`` in (0, 1),
    ``sample_rate`` in (0, 1], ``rounds`` an integer >= 1. Raises ``ValueError`` naming the first
    bad argument. Meant for a DP config's construction, so that a bad value fails before training,
    not in the accounting at its end. (Whether exactly one of ``noise_multiplier`` and
    ``target_epsilon`` is given is the caller's rule, not checked here.)"""
    if clip_norm is not None:
        check_positive(clip_norm, "clip_norm")
    if noise_multiplier is not None:
        check_noise_multiplier(noise_multiplier)
    if target_epsilon is not None:
        check_positive(target_epsilon, "target_epsilon")
    if delta is not None:
        check_delta(delta)
    if sample_rate is not None:
        check_sample_rate(sample_rate)
    if rounds is not None:
        check_steps(rounds, "rounds", minimum=1)


@dataclass(frozen=True)
class GaussianMechanism:
    """T rounds of a Poisson-subsampled Gaussian mechanism (noise multiplier z, sampling rate q);
    checked at construction (``ValueError`` naming a bad argument)."""

    noise_multiplier: float
    sample_rate: float
    steps: int

    def __post_init__(self) -> None:
        # stored as Python numbers, so that equal mechanisms share the accountant's cache
        object.__setattr__(self, "noise_multiplier", check_noise_multiplier(self.noise_multiplier))
        object.__setattr__(self, "sample_rate", check_sample_rate(self.sample_rate))
        object.__setattr__(self, "steps", check_steps(self.steps))


def _accountant(mechanisms: Sequence[GaussianMechanism]):  # -> opacus RDPAccountant
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(m.noise_multiplier, m.sample_rate, m.steps) for m in mechanisms if m.steps > 0]
    return acc


def epsilon_of(mechanisms: Sequence[GaussianMechanism], delta: float) -> float:
    """ε at δ of the sequential composition of ``mechanisms`` (RDP added at each order; cached,
    since the K clusters of an ensemble usually share one mechanism)."""
    mechanisms = tuple(mechanisms)
    for i, mechanism in enumerate(mechanisms):
        if not isinstance(mechanism, GaussianMechanism):
            raise ValueError(f"mechanisms[{i}] must be a GaussianMechanism, got {mechanism!r}")
    return _epsilon_of(mechanisms, check_delta(delta))


@functools.lru_cache(maxsize=1024)
def _epsilon_of(mechanisms: tuple[GaussianMechanism, ...], delta: float) -> float:
    if not any(m.steps > 0 for m in mechanisms):
        return 0.0
    return float(_accountant(mechanisms).get_epsilon(delta=delta))


def epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε at δ after ``steps`` rounds of the subsampled Gaussian (z, q) (Opacus RDP); ``ValueError``
    unless z is finite and >= 0, 0 < q <= 1, steps an integer >= 0 and 0 < δ < 1."""
    return epsilon_of([GaussianMechanism(noise_multiplier, sample_rate, steps)], delta)


def noise_multiplier_for(
    target_epsilon: float, delta: float, sample_rate: float, steps: int
) -> float:
    """The noise multiplier z that reaches ``target_epsilon`` at δ (Opacus's RDP calibration;
    cached, since the search takes seconds); ``ValueError`` unless ε is finite and > 0,
    0 < δ < 1, 0 < q <= 1 and steps an integer >= 1."""
    return _noise_multiplier_for(
        check_positive(target_epsilon, "target_epsilon"),
        check_delta(delta),
        check_sample_rate(sample_rate),
        check_steps(steps, minimum=1),
    )


@functools.lru_cache(maxsize=256)
def _noise_multiplier_for(
    target_epsilon: float, delta: float, sample_rate: float, steps: int
) -> float:
    from opacus.accountants.utils import get_noise_multiplier

    return float(
        get_noise_multiplier(
            target_epsilon=target_epsilon,
            target_delta=delta,
            sample_rate=sample_rate,
            steps=steps,
            accountant="rdp",
        )
    )


@dataclass(frozen=True)
class FELPrivacy:
    """The ensemble's guarantee: ε at δ, the max over clusters of each cluster's ε."""

    epsilon: float
    delta: float
    per_cluster: dict[int, float]


def fel_epsilon(
    leaves: Mapping[int, Sequence[GaussianMechanism]],
    delta: float,
    *,
    shared: Sequence[GaussianMechanism] = (),
) -> FELPrivacy:
    """ε of FEL: ``leaves[c]`` are the mechanisms run on cluster c's users (its leaf, and e.g. a
    private leaf of the same users); ``shared`` are mechanisms that touch every user's protected
    data (e.g. an over-arch trained with DP on non-opt-in users). Within a cluster everything is
    composed sequentially; across clusters the max is taken (parallel composition). Opt-in-only
    training is not passed: it costs the other users nothing."""
    delta = check_delta(delta)
    per = {int(c): epsilon_of([*mechs, *shared], delta) for c, mechs in leaves.items()}
    worst = max(per.values()) if per else epsilon_of(shared, delta)
    return FELPrivacy(worst, delta, per)


def clip_updates(deltas: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """Scale each row (one client's flattened update) to L2 norm at most ``clip_norm``."""
    norms = deltas.norm(dim=1, keepdim=True)
    return deltas * torch.clamp(clip_norm / (norms + 1e-12), max=1.0)


def dp_aggregate(
    deltas: torch.Tensor,
    cluster: torch.Tensor,
    num_clusters: int,
    *,
    clip_norm: float,
    noise_multiplier: float,
    denominator: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """(K, P) per-cluster DP averages of a round's client updates.

    ``deltas`` (C, P) are the sampled clients' updates and ``cluster`` (C,) their clusters; each
    row is clipped to ``clip_norm``, summed per cluster, Gaussian noise with standard deviation
    ``noise_multiplier * clip_norm`` is added to every cluster's sum (also to a cluster with no
    sampled client this round), and the result divided by ``denominator`` (K,) (q N_c).

    Everything is checked before any noise is drawn: ``clip_norm`` finite and > 0,
    ``noise_multiplier`` finite and >= 0 (``ValueError``); a client update with NaN or inf aborts
    the round with :class:`~fedrec.federation.secagg.MalformedContribution` naming the client's
    row and cluster (no aggregate: clipping would turn it into NaN and spread it over its
    cluster's model), as MF-SecAvg does.
    """
    clip_norm = check_positive(clip_norm, "clip_norm")
    noise_multiplier = check_noise_multiplier(noise_multiplier)
    if deltas.ndim != 2 or cluster.shape != (deltas.shape[0],):
        raise ValueError(
            f"deltas must be (C, P) with one cluster per row, got deltas {tuple(deltas.shape)} "
            f"and cluster {tuple(cluster.shape)}"
        )
    if denominator.shape != (num_clusters,):
        raise ValueError(
            f"denominator must have shape ({num_clusters},) (q N_c per cluster), got "
            f"{tuple(denominator.shape)}"
        )
    positive = torch.isfinite(denominator) & (denominator > 0)
    if not bool(positive.all()):
        raise ValueError(
            f"denominator (q N_c) must be finite and > 0, got {denominator[~positive].tolist()[:5]}"
        )
    finite = torch.isfinite(deltas).all(dim=1)
    if not bool(finite.all()):
        from fedrec.federation.secagg import MalformedContribution

        bad = torch.nonzero(~finite).flatten().tolist()
        clusters = sorted({int(cluster[i]) for i in bad})
        raise MalformedContribution(
            f"malformed client update: {len(bad)} update(s) with NaN or inf (rows {bad[:5]}, "
            f"cluster(s) {clusters[:5]}); DP round aborted, no aggregate"
        )
    clipped = clip_updates(deltas, clip_norm)
    sums = torch.zeros(num_clusters, deltas.shape[1], dtype=deltas.dtype)
    sums.index_add_(0, cluster, clipped)
    noise = torch.randn(sums.shape, generator=generator, dtype=deltas.dtype)
    return (sums + noise_multiplier * clip_norm * noise) / denominator[:, None]
