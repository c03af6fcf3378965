"""What a secure-aggregation round ends with, whichever protocol ran it: a
:class:`SecureSumResult` (the unmasked sum and what the round cost), or an abort
(:class:`SecAggAborted`, and :class:`MalformedContribution` for an input that cannot enter the
sum), after which the caller keeps its global model."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class SecAggAborted(RuntimeError):
    """The round was aborted: too few clients survived to unmask the sum, or a client's
    contribution was malformed (no aggregate; the caller keeps its global model)."""


class MalformedContribution(SecAggAborted):
    """A client's input cannot enter the secure sum (wrong dtype or shape, NaN/inf, out of the
    fixed-point range): the round is aborted before it starts."""


@dataclass
class SecureSumResult:
    """The unmasked sum of the survivors' plaintext vectors, and what the round cost."""

    total: np.ndarray
    """Σ_{k∈survivors} x_k in Z_{2^64} (uint64)."""
    survivors: list[int]
    """positions of the clients whose inputs are in the sum."""
    dropped: list[int]
    """positions that dropped after sharing keys (their masks were recovered)."""
    client_seconds: float
    """wall time of all clients' work (keys, shares, masking), summed over clients."""
    server_seconds: float
    """wall time of the server's unmasking."""
    upload_bytes_per_client: int
    """bytes one client uploads: public keys, encrypted shares, masked vector, unmask shares."""
    masked: dict[int, np.ndarray] = field(default_factory=dict)
    """the masked uploads the server received (kept for tests and inspection)."""
    absent: list[int] = field(default_factory=list)
    """positions that dropped before sharing their keys (nobody masked with them)."""
    protocol: str = "secagg (complete graph)"
    """which protocol ran: the complete-graph protocol or SecAgg+ (:mod:`.plus`)."""
    degree: int | None = None
    """SecAgg+: neighbours per client (None: the complete-graph protocol, n − 1)."""
    threshold: int | None = None
    """Shamir threshold: per neighbourhood for SecAgg+, over all clients otherwise."""
    neighbours: np.ndarray | None = None
    """SecAgg+: (n, degree) each client's neighbours in the round's graph."""
    graph_seed: bytes | None = None
    """SecAgg+: the public randomness the graph's labelling was drawn from."""
    key_agreements: int = 0
    """X25519 exchanges computed in the round (SecAgg+ reuses long-term pair keys)."""
    prg_streams: int = 0
    """full-length PRG streams expanded by clients and server (SecAgg+)."""
    parts: list[np.ndarray] = field(default_factory=list)
    """SecAgg+: the sum of each segment of the rows (one uint64 segment for word vectors; for a
    :class:`WordRows`, its segments' sums, of which ``total`` is the byte row)."""
