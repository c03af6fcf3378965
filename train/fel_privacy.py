"""DP-FedAvg for FEL's leaves and the privacy accounting of the whole ensemble.

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
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GaussianMechanism:
    """T rounds of a Poisson-subsampled Gaussian mechanism (noise multiplier z, sampling rate q)."""

    noise_multiplier: float
    sample_rate: float
    steps: int


def _accountant(mechanisms: Sequence[GaussianMechanism]):  # -> opacus RDPAccountant
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(m.noise_multiplier, m.sample_rate, m.steps) for m in mechanisms if m.steps > 0]
    return acc


def epsilon_of(mechanisms: Sequence[GaussianMechanism], delta: float) -> float:
    """ε at δ of the sequential composition of ``mechanisms`` (RDP added at each order; cached,
    since the K clusters of an ensemble usually share one mechanism)."""
    return _epsilon_of(tuple(mechanisms), float(delta))


@functools.lru_cache(maxsize=1024)
def _epsilon_of(mechanisms: tuple[GaussianMechanism, ...], delta: float) -> float:
    if not any(m.steps > 0 for m in mechanisms):
        return 0.0
    return float(_accountant(mechanisms).get_epsilon(delta=delta))


def epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε at δ after ``steps`` rounds of the subsampled Gaussian (z, q) (Opacus RDP)."""
    return epsilon_of([GaussianMechanism(noise_multiplier, sample_rate, steps)], delta)


@functools.lru_cache(maxsize=256)
def noise_multiplier_for(
    target_epsilon: float, delta: float, sample_rate: float, steps: int
) -> float:
    """The noise multiplier z that reaches ``target_epsilon`` at δ (Opacus's RDP calibration;
    cached, since the search takes seconds)."""
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
    """
    clipped = clip_updates(deltas, clip_norm)
    sums = torch.zeros(num_clusters, deltas.shape[1], dtype=deltas.dtype)
    sums.index_add_(0, cluster, clipped)
    noise = torch.randn(sums.shape, generator=generator, dtype=deltas.dtype)
    return (sums + noise_multiplier * clip_norm * noise) / denominator[:, None]
