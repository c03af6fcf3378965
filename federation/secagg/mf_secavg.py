"""MF-SecAvg: MF-FedAvg computed by secure aggregation, so the server only sees masked uploads.

:class:`MFSecAvg` is the aggregator: each round it checks and encodes the clients' uploads
(:mod:`fedrec.federation.secagg.mf_plaintext`), runs one secure sum over them -- SecAgg+ by
default (:mod:`fedrec.federation.secagg.plus`: masks and shares only between neighbours of a
sparse random graph, long-term pair keys, AES masks; docs/secure_aggregation.md), sized by a
bounded-fraction threat model, or the complete-graph protocol
(:mod:`fedrec.federation.secagg.complete`) -- and decodes the sums into the new global tables.
:class:`SecureTables` is a companion pair of tables aggregated in the same run.
"""

from __future__ import annotations

import hmac
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from fedrec.federation.aggregators import Aggregator, ClientUpdates
from fedrec.federation.secagg.graph import ThreatModel
from fedrec.federation.secagg.inputs import WordRows
from fedrec.federation.secagg.keys import KeyDirectory
from fedrec.federation.secagg.mf_plaintext import (
    check_updates,
    decode_mf_secavg,
    item_fraction_bits,
    mf_secavg_rows,
)
from fedrec.federation.secagg.outcome import SecAggAborted, SecureSumResult
from fedrec.federation.secagg.plus import secure_sum_plus
from fedrec.federation.secagg.protocol import plus_graph, secure_sum


@dataclass(frozen=True)
class SecureTables:
    """A pair of tables that MF-SecAvg aggregates like the weights: the global ``items`` (I, W)
    and ``network`` (N,), the clients' uploads of them, and the fixed point of their encoding
    (:meth:`MFSecAvg.aggregate_with`)."""

    items: torch.Tensor
    network: torch.Tensor
    updates: ClientUpdates
    fraction_bits: int
    """fraction bits of the network part and, in 64-bit words, of the item deltas."""

    def __post_init__(self) -> None:
        if not 8 <= self.fraction_bits <= 48:
            raise ValueError(f"fraction_bits must be in [8, 48], got {self.fraction_bits}")


class MFSecAvg(Aggregator):
    """MF-FedAvg on masked uploads (the encoding: :mod:`.mf_plaintext`); equal to MF-FedAvg up to
    rounding.

    The protocol is SecAgg+ by default (:mod:`fedrec.federation.secagg.plus`): a random Harary
    graph sized by ``threat`` (default :class:`~fedrec.federation.secagg.graph.ThreatModel`: an
    honest-but-curious server colluding with at most 5% of a round's clients, at most 10%
    dropouts; privacy failure ≤ 2^-40), long-term pair keys held for the aggregator's lifetime
    (``key_reuse``), and AES counter-mode masks. ``graph="complete", key_reuse=False`` is the
    complete-graph protocol of Bonawitz et al. with fresh keys every round and a global
    threshold (:mod:`fedrec.federation.secagg.complete`). A round too small for a sparse graph
    (the threat model asks for the complete graph, e.g. five clients or fewer by default) runs
    the complete-graph protocol. ``degree`` overrides the graph's degree; ``threshold`` is per neighbourhood for
    SecAgg+ and over all clients for the complete-graph protocol. ``per_client``: simulate each
    client's key derivation and masks separately (a deployment's cost) instead of once per pair.

    ``dropout``: probability that each client drops after sharing its keys (seeded by ``seed``),
    to exercise recovery during training; the graph's public randomness is drawn from the same
    seeded generator. Aborted rounds raise :class:`SecAggAborted`: too few survivors or
    answering neighbours, a disconnected survivors' graph, a round smaller than ``threshold``,
    or a malformed update (NaN/inf, wrong shape or dtype, out of the fixed-point range:
    :class:`MalformedContribution`), so the caller keeps its global model.
    """

    name = "mf-secavg"

    def __init__(
        self,
        *,
        fraction_bits: int = 24,
        threshold: int | None = None,
        dropout: float = 0.0,
        seed: int = 0,
        graph: Literal["harary", "complete"] = "harary",
        key_reuse: bool = True,
        threat: ThreatModel | None = None,
        degree: int | None = None,
        per_client: bool = False,
        item_bits: Literal[32, 64] = 32,
        delta_bound: float = 8.0,
    ) -> None:
        if not 8 <= fraction_bits <= 48:
            raise ValueError(f"fraction_bits must be in [8, 48], got {fraction_bits}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if threshold is not None and threshold < 2:
            raise ValueError(f"threshold must be >= 2, got {threshold}")
        if graph not in ("harary", "complete"):
            raise ValueError(f"graph must be 'harary' or 'complete', got {graph!r}")
        if item_bits not in (32, 64):
            raise ValueError(f"item_bits must be 32 or 64, got {item_bits!r}")
        if not (math.isfinite(delta_bound) and delta_bound > 0):
            raise ValueError(f"delta_bound must be a positive number, got {delta_bound!r}")
        self.fraction_bits = fraction_bits
        self.item_bits = item_bits
        self.delta_bound = float(delta_bound)
        self.threshold = threshold
        self.dropout = dropout
        self.rng = np.random.default_rng(seed)
        self._graph_key = self.rng.bytes(32)
        """public randomness of the run's graphs: one graph per distinct set of clients."""
        self.graph = graph
        self.threat = threat or ThreatModel()
        self.degree = degree
        self.per_client = per_client
        self.keys = KeyDirectory() if key_reuse else None
        """the clients' long-term keys (None: fresh keys every round)."""
        self.rounds = 0
        self.last: SecureSumResult | None = None

    @property
    def protocol(self) -> str:
        """A label of the configured protocol (for tables)."""
        if self.graph == "complete" and self.keys is None:
            return "secagg (complete graph, per-round keys)"
        graph = "Harary graph" if self.graph == "harary" else "complete graph"
        keys = "long-term keys" if self.keys is not None else "per-round keys"
        return f"secagg+ ({graph}, {keys})"

    def aggregate(
        self, *, items: torch.Tensor, network: torch.Tensor, updates: ClientUpdates
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._secure_round([SecureTables(items, network, updates, self.fraction_bits)])[0]

    def aggregate_with(
        self,
        *,
        items: torch.Tensor,
        network: torch.Tensor,
        updates: ClientUpdates,
        companion: SecureTables,
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """MF-SecAvg of the weights and of ``companion`` in **one** protocol run: the two
        plaintexts are the segments of one row per client, masked with one keystream per pair
        and unmasked with one set of shares, so the companion costs its mask bytes and nothing
        else, and a client that drops drops from both. The companion's item part is in 64-bit
        words with its own ``fraction_bits`` (e.g. Adam's second moments, far below the weights'
        fixed-point step). Returns ((items, network), (companion items, companion network)).
        The companion's uploads must come from the same clients touching the same rows."""
        theirs = companion.updates
        if not (
            np.array_equal(np.asarray(theirs.clients), np.asarray(updates.clients))
            and np.array_equal(np.asarray(theirs.num_samples), np.asarray(updates.num_samples))
            and torch.equal(theirs.row_client, updates.row_client)
            and torch.equal(theirs.row_item, updates.row_item)
        ):
            raise ValueError(
                "the companion's uploads must come from the same clients, with the same sample "
                "counts and the same touched rows, as the weights'"
            )
        weights = SecureTables(items, network, updates, self.fraction_bits)
        main, extra = self._secure_round([weights, companion])
        return main, extra

    def _secure_round(
        self, tables: Sequence[SecureTables]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One protocol run over the concatenated plaintexts of ``tables`` (the first in
        ``item_bits``-bit item words, the others in 64-bit ones); their decoded aggregates."""
        updates = tables[0].updates
        c = updates.num_clients
        round_id = self.rounds
        self.rounds += 1
        if c == 1:
            raise SecAggAborted("a round with one client cannot be aggregated securely")
        if self.threshold is not None and self.threshold > c:
            raise SecAggAborted(
                f"a round of {c} clients is below the threshold {self.threshold}; round aborted"
            )
        start = time.perf_counter()
        plains, item_bits = [], [self.item_bits] + [64] * (len(tables) - 1)
        for part, bits in zip(tables, item_bits, strict=True):
            check_updates(
                part.updates,
                num_items=part.items.shape[0],
                item_width=part.items.shape[1],
                network_size=part.network.numel(),
            )
            plains.append(
                mf_secavg_rows(
                    part.updates,
                    fraction_bits=part.fraction_bits,
                    items=part.items,
                    item_bits=bits,
                    delta_bound=self.delta_bound,
                )
            )
        plain = plains[0]
        if len(plains) > 1:  # one row per client: the plaintexts side by side
            plain = WordRows(
                np.concatenate([p.buffer for p in plains], axis=1),
                tuple(entry for p in plains for entry in p.layout),
            )
        encode_seconds = time.perf_counter() - start
        dropped = np.flatnonzero(self.rng.random(c) < self.dropout) if self.dropout else []
        ids = np.asarray(updates.clients).astype(np.int64)
        plus = plus_graph(
            c, graph=self.graph, keys=self.keys, threat=self.threat, degree=self.degree
        )
        if plus is None:  # 64-bit words throughout; each segment's sum reduced to its width
            result = secure_sum(
                plain, round_id=round_id, threshold=self.threshold, dropped_after_sharing=dropped
            )
        else:
            result = secure_sum_plus(
                plain,
                round_id=round_id,
                client_ids=ids.tolist(),
                keys=self.keys,
                graph=plus,
                threat=self.threat,
                degree=self.degree,
                threshold=self.threshold,
                graph_seed=self.graph_seed(ids),
                per_client=self.per_client,
                overwrite_input=True,
                dropped_after_sharing=dropped,
            )
        result.client_seconds += encode_seconds
        self.last = result
        start = time.perf_counter()
        decoded, at = [], 0
        for part, p, bits in zip(tables, plains, item_bits, strict=True):
            segments = len(p.layout)
            decoded.append(
                decode_mf_secavg(
                    result.parts[at : at + segments],
                    items=part.items,
                    network=part.network,
                    fraction_bits=part.fraction_bits,
                    item_fraction_bits=item_fraction_bits(
                        c,
                        fraction_bits=part.fraction_bits,
                        item_bits=bits,
                        delta_bound=self.delta_bound,
                    ),
                    num_clients=c,
                )
            )
            at += segments
        result.server_seconds += time.perf_counter() - start
        return decoded

    def graph_seed(self, client_ids: np.ndarray) -> bytes:
        """The public seed of the Harary graph of a round of ``client_ids`` (in position order):
        HMAC of the run's graph key and the ids, so a set of clients that meets again (a fixed
        cohort) gets the same graph, and so meets the same neighbours, whose pair keys are
        cached; a new set gets an independent graph."""
        ids = np.ascontiguousarray(client_ids, dtype="<i8")
        return hmac.digest(self._graph_key, ids.tobytes(), "sha256")[:16]
