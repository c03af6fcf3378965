"""The batched simulation's layout of a round: its examples packed for lockstep training
(:func:`_plan_round`), clients sorted by their number of local steps so that the clients still
training at any step are a prefix of the stack.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedrec.train.fedncf.sampling import RoundSamples


@dataclass
class _RoundPlan:
    """A round's examples packed for lockstep training (clients sorted by local steps, desc).

    Step t trains the first ``active[t]`` clients of the stack on one batch each; its entries are
    ``[offsets[t], offsets[t+1])`` of the packed arrays, laid out (active[t], B). Each client's
    item rows live in one flat table (the rows it touches, then a dummy row for padding). A step's
    distinct rows are listed in the order of their first occurrence, its repeated occurrences in
    entry order (so repeats of one row are added in the order of their entries).
    """

    order: np.ndarray  # (C,) client positions, by descending local steps
    active: np.ndarray  # (T,) clients still training at step t (a prefix of the stack)
    offsets: np.ndarray  # (T+1,) packed-entry offsets of each step
    flat_rows: np.ndarray  # (entries,) flat-table row of each entry (dummy for padding)
    labels: np.ndarray  # (entries,) float32
    weights: np.ndarray  # (entries,) float32 1/(valid batch size); 0 for padding
    unique_offsets: np.ndarray  # (T+1,) offsets of each step's distinct rows
    unique_rows: np.ndarray  # distinct flat rows touched at each step, step after step
    unique_first: np.ndarray  # step-relative entry holding each distinct row's first occurrence
    dup_offsets: np.ndarray  # (T+1,) offsets of each step's repeated occurrences
    dup_target: np.ndarray  # step-relative distinct-row index of each repeated occurrence
    dup_source: np.ndarray  # step-relative entry of each repeated occurrence
    row_client: np.ndarray  # (R,) stack position of each flat row's client
    row_item: np.ndarray  # (R,) item id of each flat row


def _plan_round(samples: RoundSamples, *, batch_size: int, num_items: int) -> _RoundPlan:
    n = samples.samples
    batches = -(-n // batch_size)
    steps = (int(samples.epoch.max()) + 1) * batches
    order = np.argsort(-steps, kind="stable")
    slot_of = np.empty_like(order)
    slot_of[order] = np.arange(len(order))
    total_steps = int(steps.max())
    active = (steps[order][None, :] > np.arange(total_steps)[:, None]).sum(1)
    offsets = np.concatenate([[0], np.cumsum(active * batch_size)])
    client = samples.client
    slot = slot_of[client]
    batch, within_batch = np.divmod(samples.position, batch_size)
    t = samples.epoch * batches[client] + batch
    rel = slot * batch_size + within_batch  # entry within its step
    # flat table: each client's touched items in (slot, item) order, then the dummy row
    key = slot * num_items + samples.items
    mark = np.zeros(len(order) * num_items, dtype=bool)
    mark[key] = True
    touched = np.flatnonzero(mark)
    flat = (np.cumsum(mark) - 1)[key]
    dummy = len(touched)
    entries = int(offsets[-1])
    flat_rows = np.full(entries, dummy, np.int64)
    labels = np.zeros(entries, np.float32)
    weights = np.zeros(entries, np.float32)
    packed = offsets[t] + rel
    flat_rows[packed] = flat
    labels[packed] = samples.labels
    # 1 / (size of the batch): per client and batch, then per example
    sizes = n[:, None] - np.arange(int(batches.max()))[None, :] * batch_size
    weight_of = 1.0 / np.clip(sizes, 1, batch_size)
    weights[packed] = weight_of.ravel()[client * weight_of.shape[1] + batch]
    # distinct rows per step. A row repeats only inside one client's batch; the entries (in packed
    # order: by step, then entry) are grouped by row with a stable sort, so that each group of
    # one row at one step starts with its first entry.
    valid = np.zeros(entries, dtype=bool)
    valid[packed] = True
    entry = np.flatnonzero(valid)  # packed positions of the examples, ascending
    rows = flat_rows[entry]
    step = np.repeat(np.arange(total_steps), active * batch_size)[entry]
    by_row = np.argsort(rows.astype(np.uint16) if dummy < 2**16 else rows, kind="stable")
    row_step = (rows * total_steps + step)[by_row]
    first_s = np.ones(len(entry), dtype=bool)
    np.not_equal(row_step[1:], row_step[:-1], out=first_s[1:])
    first = np.empty_like(first_s)
    first[by_row] = first_s
    unique_index = np.cumsum(first) - 1  # in packed order, among the first occurrences
    group_unique = unique_index[by_row[first_s]]  # each group's distinct-row index
    dups_s = ~first_s
    dup_entry = by_row[dups_s]
    dup_unique = group_unique[(np.cumsum(first_s) - 1)[dups_s]]
    in_order = np.argsort(dup_entry)  # the repeats in packed order
    dup_entry, dup_unique = dup_entry[in_order], dup_unique[in_order]
    within = entry - offsets[step]
    unique_offsets = np.searchsorted(step[first], np.arange(total_steps + 1))
    dup_step = step[dup_entry]
    return _RoundPlan(
        order=order,
        active=active,
        offsets=offsets,
        flat_rows=flat_rows,
        labels=labels,
        weights=weights,
        unique_offsets=unique_offsets,
        unique_rows=rows[first],
        unique_first=within[first],
        dup_offsets=np.searchsorted(dup_step, np.arange(total_steps + 1)),
        dup_target=dup_unique - unique_offsets[dup_step],
        dup_source=within[dup_entry],
        row_client=touched // num_items,
        row_item=touched % num_items,
    )
