"""MF-SecAvg's plaintext: FedNCF uploads encoded as the integer rows secure aggregation adds, and
the unmasked sums decoded into the new global tables.

The plaintext of client k (docs/fedncf.md §4) is two segments of one
:class:`~fedrec.federation.secagg.inputs.WordRows` row (:func:`mf_secavg_layout`): 64-bit words
``[n_k θ_k | n_k]`` and, in 32-bit words by default, ``[d_k | MP_k]``, where
d_k = rint(Q_k · 2^f) − rint(Q · 2^f) on the rows k touched (zero elsewhere; Q is the global
table, which the server knows) and MP_k is packed four 0/1 flags to a word. The server obtains
Σ n_k θ_k, N, the per-item sums Σ d_k and the per-item counts c_i, and nothing per client; it
decodes Q[i] ← (rint(Q[i] 2^f) + Σ d_k[i] / c_i) / 2^f (:func:`decode_mf_secavg`). Fixed
point: the network part is scaled by 2^fraction_bits; the item deltas by 2^f with
f = :func:`item_fraction_bits` (``fraction_bits`` capped so that n deltas below ``delta_bound``
cannot wrap 32 bits: f = 23 for 20 clients); integers (n_k, MP_k) are sent as they are. Sums
are exact modulo 2^64 and 2^32, so the secure aggregate equals MF-FedAvg up to the rounding of
each client's values (≤ 2^-(f+1) per item value, ≤ C · 2^-(fraction_bits+1) per network
weight). A value outside the encodable range is never clipped: the round aborts with a
:class:`~fedrec.federation.secagg.outcome.MalformedContribution` naming the client and the
part. The quantisation happens in :func:`mf_secavg_vector` (the per-client reference, through
:func:`~fedrec.federation.secagg.inputs.encode_fixed_point`) and :func:`mf_secavg_rows` (all
clients at once, the same bytes); the secure sum itself only adds integers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from fedrec.federation.aggregators import ClientUpdates
from fedrec.federation.secagg.inputs import (
    WordRows,
    decode_fixed_point,
    encode_fixed_point,
)
from fedrec.federation.secagg.outcome import MalformedContribution

_FLOAT_DTYPES = (torch.float16, torch.float32, torch.float64)


def check_updates(
    updates: ClientUpdates,
    *,
    num_items: int | None = None,
    item_width: int | None = None,
    network_size: int | None = None,
) -> None:
    """Check a round's uploads before MF-SecAvg encodes them: tensors of a float dtype and of
    the global model's shapes (when given), item ids in range and distinct per client, sample
    counts that are positive integers. Raises :class:`MalformedContribution` (an abort)."""

    def bad(message: str) -> MalformedContribution:
        return MalformedContribution(f"malformed client update: {message}; round aborted")

    c = updates.num_clients
    for name in ("network", "item_rows"):
        value = getattr(updates, name)
        if not isinstance(value, torch.Tensor) or value.dtype not in _FLOAT_DTYPES:
            kind = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
            raise bad(f"{name} must be a float16/32/64 tensor, got {kind}")
        if value.ndim != 2:
            raise bad(f"{name} must be 2-d, got shape {tuple(value.shape)}")
    for name in ("row_client", "row_item"):
        value = getattr(updates, name)
        if not isinstance(value, torch.Tensor) or value.dtype != torch.int64 or value.ndim != 1:
            kind = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
            raise bad(f"{name} must be a 1-d int64 tensor, got {kind}")
    if network_size is not None and updates.network.shape[1] != network_size:
        raise bad(
            f"network rows of {updates.network.shape[1]} weights, the model has {network_size}"
        )
    if num_items is not None and updates.num_items != num_items:
        raise bad(f"num_items {updates.num_items}, the item table has {num_items} rows")
    if item_width is not None and updates.item_rows.shape[1] != item_width:
        raise bad(f"item rows of width {updates.item_rows.shape[1]}, the table's is {item_width}")
    rows_client, rows_item = updates.row_client.numpy(), updates.row_item.numpy()
    if len(rows_client) and not (0 <= rows_client.min() and rows_client.max() < c):
        raise bad(f"row_client outside [0, {c})")
    if len(rows_item) and not (0 <= rows_item.min() and rows_item.max() < updates.num_items):
        raise bad(f"row_item outside [0, {updates.num_items})")
    pairs = rows_client.astype(np.int64) * max(updates.num_items, 1) + rows_item
    seen = np.zeros(c * max(updates.num_items, 1), dtype=bool)
    seen[pairs] = True
    if np.count_nonzero(seen) != len(pairs):
        raise bad("a client uploaded the same item row twice")
    samples = np.asarray(updates.num_samples)
    if samples.shape != (c,) or samples.dtype.kind not in "iuf":
        raise bad(f"num_samples must be {c} numbers, got {samples.dtype} of shape {samples.shape}")
    if not (np.isfinite(samples).all() and (samples == np.rint(samples)).all()):
        raise bad("num_samples must be whole numbers")
    if not ((samples >= 1).all() and float(samples.astype(np.float64).sum()) < 2.0**62):
        raise bad("num_samples must be >= 1 and their sum below 2^62")


def item_fraction_bits(
    num_clients: int, *, fraction_bits: int, item_bits: int = 32, delta_bound: float = 8.0
) -> int:
    """Fraction bits of MF-SecAvg's item part for a round of ``num_clients``: ``fraction_bits``
    in 64-bit words; in 32-bit words the most, up to ``fraction_bits``, with which the sum of
    ``num_clients`` deltas of magnitude below ``delta_bound`` cannot wrap:
    f = 31 − ⌈log2 n⌉ − ⌈log2 delta_bound⌉ (so n · delta_bound · 2^f ≤ 2^31). A public
    function of n, never of the data."""
    if item_bits == 64:
        return fraction_bits
    if item_bits != 32:
        raise ValueError(f"item_bits must be 32 or 64, got {item_bits}")
    headroom = math.ceil(math.log2(max(num_clients, 1))) + math.ceil(math.log2(delta_bound))
    bits = min(fraction_bits, 31 - headroom)
    if bits < 8:
        raise ValueError(
            f"{num_clients} clients with item deltas up to {delta_bound} leave {bits} fraction "
            "bits in 32-bit words (fewer than 8); use item_bits=64 or a smaller delta_bound"
        )
    return bits


def count_lane_dtype(num_clients: int) -> np.dtype:
    """The unsigned lane that holds a per-item count c_i ≤ ``num_clients`` in MF-SecAvg's
    packed count words: 8 bits below 256 clients, 16 below 65,536, else 32."""
    bits = 8 if num_clients < 2**8 else 16 if num_clients < 2**16 else 32
    return np.dtype(f"<u{bits // 8}")


def mf_secavg_layout(
    *,
    network_size: int,
    num_items: int,
    item_width: int,
    item_bits: int = 32,
    num_clients: int = 255,
) -> tuple[tuple[str, int], ...]:
    """The :class:`WordRows` layout of an MF-SecAvg plaintext: 64-bit ``[n_k θ_k | n_k]``, then
    ``[MP_k ⊙ (Q_k − Q) | MP_k]`` in ``item_bits``-bit words, MP_k packed in lanes of
    :func:`count_lane_dtype` (four 0/1 flags per 32-bit word below 256 clients: a word's sum
    modulo 2^32 is exact lane by lane while no lane's sum reaches 2^8, so the counts cost a
    quarter of the words)."""
    word = 4 if item_bits == 32 else 8
    lane = count_lane_dtype(num_clients).itemsize
    count_words = -(-num_items * lane // word)
    narrow = "<u4" if item_bits == 32 else "<u8"
    return (("<u8", network_size + 1), (narrow, num_items * item_width + count_words))


def _count_lanes(words: np.ndarray, num_items: int, num_clients: int) -> np.ndarray:
    """The first ``num_items`` count lanes of packed count words (..., W) (a view)."""
    lanes = words.view(np.uint8).view(count_lane_dtype(num_clients))
    return lanes[..., :num_items]


def fixed_point_rows(values: np.ndarray, fraction_bits: int) -> np.ndarray:
    """``rint(x · 2^fraction_bits)`` of float32 or float64 rows, as floats. Exact in the rows' own
    float type: scaling by a power of two is exact, and a float32 value that is not an integer
    is below 2^23, so its nearest integer is a float32 too. So float32 rows cost half the
    memory traffic and give the bits a float64 computation gives (``mf_secavg_vector`` computes
    in float64; the tests compare the two encodings byte for byte)."""
    values = np.asarray(values)
    if values.dtype not in (np.float32, np.float64):
        values = values.astype(np.float32)
    scaled = values * values.dtype.type(2.0**fraction_bits)
    return np.rint(scaled, out=scaled)


def _encoding_error(position: int, part: str, error: ValueError) -> MalformedContribution:
    return MalformedContribution(
        f"client {position}: its update cannot be encoded ({part}: {error}); round aborted"
    )


def mf_secavg_vector(
    updates: ClientUpdates,
    position: int,
    *,
    fraction_bits: int,
    items: torch.Tensor | None = None,
    item_bits: int = 32,
    delta_bound: float = 8.0,
) -> np.ndarray:
    """Client ``position``'s plaintext as one byte row of :func:`mf_secavg_layout`: 64-bit
    ``[n_k θ_k | n_k]`` (``fraction_bits``), then ``[d_k | MP_k]`` in ``item_bits``-bit words:
    on its touched rows d_k = rint(Q_k · 2^f) − rint(Q · 2^f), the delta from the global table
    ``items`` (zeros when None) in fixed point with f = :func:`item_fraction_bits`, zero
    elsewhere.

    The reference per-client encoding (:func:`mf_secavg_rows` encodes all clients at once, the
    same bytes). Reals go through :func:`encode_fixed_point`; NaN/inf or values outside the
    fixed-point range raise :class:`MalformedContribution` naming the client and the part (the
    round's abort; never clipped); :func:`check_updates` checks the uploads' types and shapes.
    """
    c = updates.num_clients
    num_items, width = updates.num_items, updates.item_rows.shape[1]
    bits = item_fraction_bits(
        c, fraction_bits=fraction_bits, item_bits=item_bits, delta_bound=delta_bound
    )
    n_k = int(updates.num_samples[position])
    rows = updates.row_client == position
    row_items = updates.row_item[rows].numpy()
    reference = (
        np.zeros((num_items, width))
        if items is None
        else np.rint(items.detach().numpy().astype(np.float64) * 2.0**bits)
    )
    table = np.zeros((num_items, width), dtype=np.float64)
    own = np.rint(updates.item_rows[rows].numpy().astype(np.float64) * 2.0**bits)
    table[row_items] = own - reference[row_items]  # exact: integers below 2^53
    network = updates.network[position].numpy().astype(np.float64) * n_k
    try:
        encoded_network = encode_fixed_point(network, fraction_bits=fraction_bits, num_clients=c)
    except ValueError as error:
        raise _encoding_error(position, "network", error) from error
    try:  # the integers d_k = rint(Q_k 2^f) − rint(Q 2^f), encoded with scale 1
        encoded_table = encode_fixed_point(
            table.reshape(-1), fraction_bits=0, num_clients=c, word_bits=item_bits
        )
    except ValueError as error:
        raise _encoding_error(position, f"item deltas (Q_k − Q) · 2^{bits}", error) from error
    layout = mf_secavg_layout(
        network_size=len(network),
        num_items=num_items,
        item_width=width,
        item_bits=item_bits,
        num_clients=c,
    )
    touched = np.zeros(layout[1][1] - num_items * width, dtype=encoded_table.dtype)
    _count_lanes(touched, num_items, c)[row_items] = 1
    wide = np.concatenate([encoded_network, np.array([n_k], dtype=np.uint64)])
    return np.concatenate(
        [wide.view(np.uint8), encoded_table.view(np.uint8), touched.view(np.uint8)]
    )


def mf_secavg_rows(
    updates: ClientUpdates,
    *,
    fraction_bits: int,
    items: torch.Tensor | None = None,
    item_bits: int = 32,
    delta_bound: float = 8.0,
) -> WordRows:
    """All clients' plaintexts at once: row k of the result equals :func:`mf_secavg_vector`
    ``(updates, k, ...)`` (the same encoding with whole-array operations on the R uploaded rows
    only; it expects uploads that passed :func:`check_updates`). A value that cannot be encoded
    raises the same :class:`MalformedContribution` as the per-client encoding, for the first
    such client."""
    c = updates.num_clients
    num_items, width = updates.num_items, updates.item_rows.shape[1]
    size = updates.network.shape[1]
    bits = item_fraction_bits(
        c, fraction_bits=fraction_bits, item_bits=item_bits, delta_bound=delta_bound
    )
    samples = np.asarray(updates.num_samples).astype(np.int64)
    network = updates.network.numpy().astype(np.float64)
    network *= (samples * 2.0**fraction_bits)[:, None]  # exact: a power of two times n_k
    np.rint(network, out=network)
    rows_client, rows_item = updates.row_client.numpy(), updates.row_item.numpy()
    signed = np.int32 if item_bits == 32 else np.int64
    own = fixed_point_rows(updates.item_rows.numpy(), bits)  # rint(Q_k 2^f), exact
    # one range test covers NaN/inf too (max/min are NaN then, and fail it); the per-client
    # encoding then raises the documented error for the first client concerned
    limit, item_limit = 2.0**63 / max(c, 1), 2.0 ** (item_bits - 1) / max(c, 1)
    ok = -limit < network.min(initial=0.0) <= network.max(initial=0.0) < limit
    ok = ok and -(2.0**62) < own.min(initial=0.0) <= own.max(initial=0.0) < 2.0**62
    if ok:
        deltas = own.astype(np.int64)
        if items is not None:  # d_k = rint(Q_k 2^f) − rint(Q 2^f), exact integers
            reference = fixed_point_rows(items.detach().numpy(), bits)
            ok = -(2.0**62) < reference.min(initial=0.0) <= reference.max(initial=0.0) < 2.0**62
            deltas -= np.take(reference.astype(np.int64), rows_item, axis=0)
        ok = ok and -item_limit < deltas.min(initial=0) <= deltas.max(initial=0) < item_limit
    if not ok:
        for k in range(c):
            mf_secavg_vector(
                updates,
                k,
                fraction_bits=fraction_bits,
                items=items,
                item_bits=item_bits,
                delta_bound=delta_bound,
            )
        raise MalformedContribution("an update cannot be encoded in fixed point; round aborted")
    layout = mf_secavg_layout(
        network_size=size,
        num_items=num_items,
        item_width=width,
        item_bits=item_bits,
        num_clients=c,
    )
    plain = WordRows.zeros(c, layout)
    wide, narrow = plain.segments()
    wide[:, :size] = network.astype(np.int64).view(np.uint64)
    wide[:, size] = samples.astype(np.uint64)
    encoded = deltas.astype(signed).view(narrow.dtype)
    if width:  # each uploaded row is written as one record of E words (a fast scatter)
        record = np.dtype((np.void, narrow.dtype.itemsize * width))
        table = narrow[:, : num_items * width].reshape(c, num_items, width)  # a view
        table.view(record)[:, :, 0][rows_client, rows_item] = encoded.view(record)[:, 0]
    _count_lanes(narrow[:, num_items * width :], num_items, c)[rows_client, rows_item] = 1
    return plain


def decode_mf_secavg(
    parts: Sequence[np.ndarray],
    *,
    items: torch.Tensor,
    network: torch.Tensor,
    fraction_bits: int,
    item_fraction_bits: int,
    num_clients: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """New (items, network) from the unmasked segment sums (:func:`mf_secavg_layout`):
    NN = Σ n θ / N and, for each item i some client touched,
    (rint(Q[i] 2^f) + Σ_touched d_k[i] / c_i) / 2^f = Σ_touched rint(Q_k[i] 2^f) / (c_i 2^f), the
    mean of the clients' rows to within 2^-(f+1) (f = ``item_fraction_bits``); untouched rows are
    kept exactly."""
    wide, narrow = parts
    num_items, width = items.shape
    size = network.numel()
    weighted = decode_fixed_point(wide[:size], fraction_bits=fraction_bits)
    num_samples = float(int(wide[size]))
    counts = _count_lanes(narrow[num_items * width :], num_items, num_clients).astype(np.float64)
    sums = decode_fixed_point(narrow[: num_items * width], fraction_bits=0)
    sums = sums.reshape(num_items, width)
    sums /= np.maximum(counts, 1.0)[:, None]
    # touched rows: (rint(Q 2^f) + Σ d_k / c_i) / 2^f = mean of the clients' rint(Q_k 2^f) / 2^f
    sums += fixed_point_rows(items.detach().numpy().astype(np.float64), item_fraction_bits)
    sums /= 2.0**item_fraction_bits
    untouched = counts == 0
    sums[untouched] = items.detach().numpy()[untouched]  # rows nobody touched are kept
    new_items = torch.from_numpy(sums).to(items.dtype)
    return new_items, torch.from_numpy(weighted / num_samples).to(network.dtype)


def upload_sizes(*, network_size: int, num_items: int, item_width: int) -> dict[str, int]:
    """Words of each segment of the MF-SecAvg plaintext (for cost tables)."""
    return {
        "network": network_size,
        "samples": 1,
        "items": num_items * item_width,
        "counts": num_items,
    }
