"""Which protocol runs a round: :func:`secure_sum`, the one entry point of secure aggregation.

By default the complete-graph protocol (:mod:`fedrec.federation.secagg.complete`); SecAgg+
(:mod:`fedrec.federation.secagg.plus`) on a sparse Harary graph, or with long-term keys.
:func:`plus_graph` is the rule, shared with MF-SecAvg.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from fedrec.federation.secagg.complete import secure_sum_complete
from fedrec.federation.secagg.graph import ThreatModel
from fedrec.federation.secagg.inputs import WordRows
from fedrec.federation.secagg.keys import KeyDirectory
from fedrec.federation.secagg.outcome import SecureSumResult
from fedrec.federation.secagg.plus import secure_sum_plus


def secure_sum(
    vectors: Sequence[np.ndarray] | np.ndarray | WordRows,
    *,
    round_id: int,
    threshold: int | None = None,
    graph: str = "complete",
    keys: KeyDirectory | None = None,
    threat: ThreatModel | None = None,
    degree: int | None = None,
    graph_seed: bytes | None = None,
    client_ids: Sequence[int] | None = None,
    per_client: bool = False,
    dropped_before_keys: Iterable[int] = (),
    dropped_before_sharing: Iterable[int] = (),
    dropped_after_sharing: Iterable[int] = (),
    silent_in_unmasking: Iterable[int] = (),
) -> SecureSumResult:
    """Run one secure-aggregation round over ``vectors`` (1-d integer arrays, one per client).

    By default this is the complete-graph protocol of Bonawitz et al. (:mod:`.complete`):
    every pair of clients masks, fresh keys every round, a global ``threshold``. With
    ``graph="harary"`` (a sparse random graph sized by ``threat`` or ``degree``), or with
    long-term ``keys`` (a :class:`~fedrec.federation.secagg.keys.KeyDirectory`), the round runs
    SecAgg+ instead (:func:`~fedrec.federation.secagg.plus.secure_sum_plus`, where ``threshold``
    is per neighbourhood; see its docstring for ``client_ids``, ``graph_seed``, ``per_client``).
    A Harary round of n clients whose threat model needs the complete graph anyway runs the
    complete-graph protocol.

    ``vectors`` may also be a :class:`WordRows` (segments of 64- and 32-bit words): the result's
    ``total`` is then the byte row of the segments' sums and ``parts`` the sums themselves. The
    complete-graph protocol runs it on the rows widened to 64-bit words and reduces each
    segment's sum to its width (its ``masked`` uploads are then the widened rows).
    """
    drops = {
        "dropped_before_keys": dropped_before_keys,
        "dropped_before_sharing": dropped_before_sharing,
        "dropped_after_sharing": dropped_after_sharing,
        "silent_in_unmasking": silent_in_unmasking,
    }
    rows = vectors if isinstance(vectors, WordRows) else None
    n = rows.num_rows if rows is not None else len(vectors)
    plus = plus_graph(n, graph=graph, keys=keys, threat=threat, degree=degree)
    if plus is None and rows is not None:  # 64-bit words; each segment's sum reduced after
        result = secure_sum_complete(
            list(rows.widened()), round_id=round_id, threshold=threshold, **drops
        )
        result.total = rows.narrowed(result.total)
        result.parts = rows.unpack(result.total)
        return result
    if plus is None:
        return secure_sum_complete(vectors, round_id=round_id, threshold=threshold, **drops)
    return secure_sum_plus(
        vectors,
        round_id=round_id,
        client_ids=client_ids,
        keys=keys,
        graph=plus,
        threat=threat,
        degree=degree,
        threshold=threshold,
        graph_seed=graph_seed,
        per_client=per_client,
        **drops,
    )


def plus_graph(
    n: int,
    *,
    graph: str,
    keys: KeyDirectory | None,
    threat: ThreatModel | None,
    degree: int | None,
) -> str | None:
    """The graph SecAgg+ runs on for a round of ``n`` clients, or None for the complete-graph
    protocol: a Harary graph asked for but too dense for n (the threat model needs the complete
    graph), a complete graph without long-term keys, or fewer than 3 clients."""
    if graph not in ("complete", "harary"):
        raise ValueError(f"graph must be 'complete' or 'harary', got {graph!r}")
    if graph == "complete" and degree is not None:
        raise ValueError("degree sets the Harary graph's; the complete graph has n - 1")
    if n < 3:
        return None
    if graph == "harary":
        sparse = degree is not None or not (threat or ThreatModel()).parameters(n).complete
        return "harary" if sparse else None
    return "complete" if keys is not None else None
