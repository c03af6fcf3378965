"""SecAgg+'s graph: which clients of a round mask with each other.

The server draws a public random permutation of the round's clients and places them on the ring
of the Harary graph H(n, k) (Bell et al., "Secure Single-Server Aggregation with (Poly)Logarithmic
Overhead", CCS 2020): each client is a neighbour of the k/2 clients on either side. Pairwise
masks and secret shares are exchanged only between neighbours; the threshold t is per
neighbourhood. :class:`ThreatModel` turns the fractions of corrupted clients (γ) and dropouts (δ)
into (k, t) with the paper's analysis (:func:`harary_parameters`); :func:`harary_neighbours`
draws the graph from the round's public seed, :func:`is_connected` checks the survivors' graph,
and :func:`round_parameters` / :func:`round_graph` give a round its (k, t) and its (cached)
graph.
"""

from __future__ import annotations

import functools
import hmac
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GraphParameters:
    """A round's graph: ``degree`` neighbours per client and the per-neighbourhood ``threshold``."""

    num_clients: int
    degree: int
    threshold: int

    @property
    def complete(self) -> bool:
        """Whether every client is a neighbour of every other one."""
        return self.degree >= self.num_clients - 1


@functools.lru_cache(maxsize=256)
def harary_parameters(
    num_clients: int,
    *,
    corrupted: float,
    dropout: float,
    security_bits: int = 40,
    correctness_bits: int = 20,
    min_degree: int = 4,
) -> GraphParameters:
    """The smallest even degree k ≥ ``min_degree`` of a randomly labelled Harary graph H(n, k),
    and its threshold t, that meet the threat model (the analysis of Bell et al., CCS 2020):

    - *security*: with A = ⌊γn⌋ corrupted and D = ⌊δn⌋ dropped clients placed independently of
      the random labelling, (a) the graph minus those A + D clients is disconnected with
      probability ≤ 2^-(σ+1) -- removing nodes disconnects H(n, k) only if they cover two
      disjoint runs of k/2 consecutive ring positions, so Pr ≤ n(n−k−1)/2 · C(A+D, k)/C(n, k),
      which is 0 when k > A + D; and (b) some honest client has t or more corrupted neighbours
      (who could pool t shares of both of its secrets) with probability ≤ 2^-(σ+1): t − 1 is
      the hypergeometric (n−1, A, k) quantile at 2^-(σ+1)/n (a union bound over clients);
    - *correctness*: some client has fewer than t surviving neighbours (its secrets could not be
      rebuilt; the round aborts) with probability ≤ 2^-η, via the hypergeometric
      (n−1, n−1−D, k) lower tail at 2^-η/n.

    t is the smallest secure value, which leaves the most room for dropouts beyond δ. When no
    degree below n − 1 qualifies, the result is the complete graph with a majority threshold.
    All probabilities are compared in exact integer arithmetic.
    """
    n = num_clients
    if n < 2:
        raise ValueError(f"need at least 2 clients, got {n}")
    if not (0 <= corrupted < 1 and 0 <= dropout < 1):
        raise ValueError("corrupted and dropout must be fractions in [0, 1)")
    bad_corrupt = math.floor(corrupted * n + 1e-9)
    bad_dropped = math.floor(dropout * n + 1e-9)
    bad = bad_corrupt + bad_dropped
    start = max(2, min_degree + (min_degree % 2))
    for k in range(start, n - 1, 2):
        # (a) the honest survivors stay connected: n(n−k−1)/2 · C(bad, k) / C(n, k) < 2^-(σ+1)
        if k <= bad and (
            n * (n - k - 1) * math.comb(bad, k) * 2 ** (security_bits + 1) >= 2 * math.comb(n, k)
        ):
            continue
        t = secure_threshold(n, k, corrupted=corrupted, security_bits=security_bits)
        # correctness: Pr[surviving neighbours < t] <= 2^-η / n
        if t <= k and _lower_tail_ok(n - 1, n - 1 - bad_dropped, k, t, correctness_bits, n):
            return GraphParameters(n, k, t)
    return GraphParameters(n, n - 1, n // 2 + 1 if n > 2 else 2)


def secure_threshold(num_clients: int, degree: int, *, corrupted: float, security_bits: int) -> int:
    """The smallest t ≥ 2 such that some honest client has t or more corrupted neighbours with
    probability ≤ 2^-(σ+1) (⌊γn⌋ corrupted clients among the n − 1 others, a union bound)."""
    n = num_clients
    bad_corrupt = math.floor(corrupted * n + 1e-9)
    return max(2, _upper_quantile(n - 1, bad_corrupt, degree, security_bits + 1, n) + 1)


def _hypergeometric_counts(population: int, marked: int, draws: int) -> list[int]:
    """C(marked, x) · C(population − marked, draws − x) for x = 0..draws (exact integers)."""
    return [
        math.comb(marked, x) * math.comb(population - marked, draws - x) for x in range(draws + 1)
    ]


def _upper_quantile(population: int, marked: int, draws: int, bits: int, union: int) -> int:
    """The smallest q with Pr[X > q] ≤ 2^-bits / union, X hypergeometric."""
    counts = _hypergeometric_counts(population, marked, draws)
    total = math.comb(population, draws)
    tail = 0
    for q in range(draws, -1, -1):  # tail = Pr[X > q] · total
        if tail * union * 2**bits > total:
            return q + 1
        tail += counts[q]
    return 0 if tail * union * 2**bits <= total else -1


def _lower_tail_ok(population: int, marked: int, draws: int, t: int, bits: int, union: int) -> bool:
    """Whether Pr[X < t] ≤ 2^-bits / union, X hypergeometric (marked = survivors)."""
    if marked < 0:
        return False
    counts = _hypergeometric_counts(population, marked, draws)
    return sum(counts[:t]) * union * 2**bits <= math.comb(population, draws)


@dataclass(frozen=True)
class ThreatModel:
    """The bounded-fraction threat model SecAgg+ is sized for.

    An honest-but-curious server that may collude with up to a fraction ``corrupted`` (γ) of a
    round's clients; up to a fraction ``dropout`` (δ) of the clients drop at some stage. The
    defaults (5% corrupted, as in Bell et al.'s example, and 10% dropouts) give degree 4 and
    threshold 2 for FedNCF's 20 clients per round, degree 16 for 100 clients and 36 for 1,000.
    """

    corrupted: float = 0.05
    dropout: float = 0.10
    security_bits: int = 40
    """σ: privacy fails with probability at most 2^-σ."""
    correctness_bits: int = 20
    """η: a round aborts for lack of shares with probability at most 2^-η."""
    min_degree: int = 4
    """degree floor: with degree 2 (a ring) and t = 2 a single dropout leaves its neighbours
    without enough shares."""

    def __post_init__(self) -> None:
        if not 0 <= self.corrupted < 1 or not 0 <= self.dropout < 1:
            raise ValueError("corrupted and dropout must be fractions in [0, 1)")
        if self.security_bits < 1 or self.correctness_bits < 1:
            raise ValueError("security_bits and correctness_bits must be >= 1")
        if self.min_degree < 2:
            raise ValueError(f"min_degree must be >= 2, got {self.min_degree}")

    def parameters(self, num_clients: int) -> GraphParameters:
        """(k, t) for a round of ``num_clients`` (see :func:`harary_parameters`)."""
        return harary_parameters(
            num_clients,
            corrupted=self.corrupted,
            dropout=self.dropout,
            security_bits=self.security_bits,
            correctness_bits=self.correctness_bits,
            min_degree=self.min_degree,
        )


def harary_neighbours(num_clients: int, degree: int, seed: bytes) -> np.ndarray:
    """(n, k) neighbours of each client in H(n, k) under the random labelling given by ``seed``.

    The permutation is drawn from ``seed`` (public randomness of the round), so every party
    derives the same graph. Row i lists client i's neighbours from ring offset −k/2 to +k/2
    (0 excluded); a neighbour's column + 1 is its Shamir x-coordinate for client i's secrets.
    ``degree`` must be even, or n − 1 (the complete graph, listed in position order).
    """
    n, k = num_clients, degree
    if not 1 <= k <= n - 1:
        raise ValueError(f"degree must be in [1, {n - 1}], got {k}")
    if k == n - 1:
        everyone = np.arange(n)
        return np.array([np.delete(everyone, i) for i in range(n)], dtype=np.int64).reshape(n, k)
    if k % 2:
        raise ValueError(f"a sparse Harary graph needs an even degree, got {k}")
    digest = hmac.digest(b"fedrec-secagg+/graph-v1", bytes(seed), "sha256")
    ring = np.random.default_rng(np.frombuffer(digest, dtype=np.uint32)).permutation(n)
    slot = np.empty(n, dtype=np.int64)
    slot[ring] = np.arange(n)
    half = k // 2
    offsets = np.concatenate([np.arange(-half, 0), np.arange(1, half + 1)])
    return ring[(slot[:, None] + offsets[None, :]) % n]


def is_connected(neighbours: np.ndarray, alive: np.ndarray) -> tuple[bool, int]:
    """Whether the graph restricted to the ``alive`` clients (bool mask) is connected, and its
    number of components (0 for an empty set)."""
    alive = np.asarray(alive, dtype=bool)
    remaining = alive.copy()
    components = 0
    while remaining.any():
        components += 1
        frontier = np.flatnonzero(remaining)[:1]
        remaining[frontier] = False
        while len(frontier):
            reached = neighbours[frontier].ravel()
            reached = np.unique(reached[remaining[reached]])
            remaining[reached] = False
            frontier = reached
    return components <= 1, components


@functools.lru_cache(maxsize=1024)
def round_graph(
    n: int, degree: int, seed: bytes
) -> tuple[
    np.ndarray, list[int], list[list[int]], list[list[int]], list[tuple[int, int, int, int]]
]:
    """The round's graph, cached (a cohort that meets again with the same graph seed rebuilds
    nothing): the neighbours (read-only), the ring order (for a sparse graph), the neighbour
    lists, ``mirror[m][col]`` (m's column in the row of its neighbour at column col) and the
    edges (a, column of b in a's row, b, column of a in b's row) with a < b."""
    nbrs = harary_neighbours(n, degree, seed)
    nbrs.setflags(write=False)
    lists = nbrs.tolist()
    column_of = [{j: col for col, j in enumerate(row)} for row in lists]
    mirror = [[column_of[j][m] for j in row] for m, row in enumerate(lists)]
    edges = [
        (a, col, b, mirror[a][col])
        for a, row in enumerate(lists)
        for col, b in enumerate(row)
        if a < b
    ]
    ring = _ring_order(nbrs) if degree < n - 1 else list(range(n))
    return nbrs, ring, lists, mirror, edges


def round_parameters(
    n: int, graph: str, threat: ThreatModel | None, degree: int | None, threshold: int | None
) -> GraphParameters:
    if graph not in ("harary", "complete"):
        raise ValueError(f"graph must be 'harary' or 'complete', got {graph!r}")
    if graph == "complete":
        if degree is not None and degree != n - 1:
            raise ValueError("the complete graph has degree n - 1")
        k = n - 1
        t = min(n // 2 + 1, k) if threshold is None else threshold
    else:
        base = (threat or ThreatModel()).parameters(n) if degree is None else None
        k = base.degree if base is not None else degree
        if degree is not None and not (2 <= k <= n - 1 and (k % 2 == 0 or k == n - 1)):
            raise ValueError(f"degree must be even in [2, {n - 1}] or {n - 1}, got {degree}")
        model = threat or ThreatModel()
        t = threshold
        if t is None:
            t = (
                base.threshold
                if base is not None
                else secure_threshold(
                    n, k, corrupted=model.corrupted, security_bits=model.security_bits
                )
            )
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 2 <= t <= k:
        raise ValueError(f"threshold must be an integer in [2, {k}] (the degree), got {t!r}")
    return GraphParameters(n, k, int(t))


def _ring_order(neighbours: np.ndarray) -> list[int]:
    """The clients of a sparse Harary graph in ring order (column k/2 is the +1 neighbour)."""
    step = neighbours[:, neighbours.shape[1] // 2].tolist()
    order, current = [0], step[0]
    while current != 0:
        order.append(current)
        current = step[current]
    return order
