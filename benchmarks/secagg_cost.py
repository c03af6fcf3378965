"""Cost of secure aggregation: plain sum, the complete-graph protocol and SecAgg+.

Usage: ``python benchmarks/secagg_cost.py [--clients 20 100 1000] [--repeats 5]
[--global-rounds 3] [--dataset ml-100k] [--data-dir DIR] [--old-max 100]``.

**Part 1, one aggregation round.** For each number of clients it sums random vectors of the
length of FedGMF's MF-SecAvg plaintext on ML-100K (21,880 64-bit words) with: the plain sum;
the complete-graph protocol (Bonawitz et al. 2017: every pair masks, fresh X25519 keys every
round); SecAgg+ with per-round keys; SecAgg+ with long-term pair keys as simulated (each pair's
key and mask stream computed once for its two clients); and the same with every client deriving
its own (``per_client``: the CPU a deployment spends). It prints the median of ``--repeats``
rounds, the degree k and threshold t, the X25519 exchanges and PRG streams per round and the
ratios. The complete-graph protocol grows like n^3 (Shamir shares among all clients with a
majority threshold); above ``--old-max`` clients it is estimated (marked ≈) from its operation
counts and the unit costs of its primitives measured here.

**Part 2, a FedGMF run.** It trains FedGMF (20 clients per aggregation round, MF-FedAvg) for
``--global-rounds`` and, on every round's real uploads, also times MF-SecAvg with SecAgg+
(simulated and per-client) and, every 8th round, the complete-graph protocol. The median plain
training time per aggregation round (local training plus MF-FedAvg) is the reference. The added
time of a protocol is its median aggregation time minus MF-FedAvg's. SecAgg+'s X25519 cost
depends on how often pairs meet again, so its 400-global-round projection replaces the key
agreements of the measured rounds (nearly all first meetings) by the distinct pairs of a 400-
round schedule (simulated: the trainer's client groups with a fresh random graph every round),
at the X25519 cost measured here. Without the ML-100K files (``fedrec data fetch ml-100k``) it
uses a synthetic data set of ML-100K's shape (943 users, 1,682 items, about 106 ratings per
user) and says so.

The default run takes one to two minutes on 2 cores. Timings are wall-clock medians; run it on
an otherwise idle machine for absolute numbers (the ratios are measured interleaved).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedrec.agents.ncf import NCFConfig
from fedrec.federation.aggregators import Aggregator, ClientUpdates, MFFedAvg
from fedrec.federation.secagg import (
    KeyDirectory,
    MFSecAvg,
    ThreatModel,
    WordRows,
    harary_neighbours,
    mf_secavg_layout,
    secure_sum,
    secure_sum_plus,
    upload_sizes,
)

VARIANTS = ("plain", "complete", "fresh", "reuse", "per_client")


def gmf_length(num_items: int = 1682) -> int:
    """Words of FedGMF's MF-SecAvg plaintext on an ML-100K-sized data set, all 64-bit (the
    encoding before 32-bit item words and packed counts)."""
    config = NCFConfig(model="gmf")
    sizes = upload_sizes(
        network_size=config.network_size, num_items=num_items, item_width=config.item_width
    )
    return sum(sizes.values())


def gmf_layout(num_clients: int = 20, num_items: int = 1682) -> tuple[tuple[str, int], ...]:
    """The :class:`WordRows` layout of FedGMF's MF-SecAvg plaintext on an ML-100K-sized data set
    (64-bit network words, 32-bit item deltas, counts packed in 8-bit lanes)."""
    config = NCFConfig(model="gmf")
    return mf_secavg_layout(
        network_size=config.network_size,
        num_items=num_items,
        item_width=config.item_width,
        num_clients=num_clients,
    )


def random_rows(n: int, layout: tuple[tuple[str, int], ...], seed: int) -> WordRows:
    rows = WordRows.zeros(n, layout)
    rows.buffer[:] = np.random.default_rng(seed).integers(0, 256, rows.buffer.shape, np.uint8)
    return rows


def x25519_seconds(repeats: int = 200) -> float:
    """Median seconds of one X25519 exchange (public key object already parsed)."""
    key, peer = X25519PrivateKey.generate(), X25519PrivateKey.generate().public_key()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        key.exchange(peer)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def keygen_seconds(repeats: int = 200) -> float:
    """Median seconds of generating one X25519 key pair (a client's enrolment)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        X25519PrivateKey.generate().public_key()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ------------------------------------------------------------------------------------------------
# Part 1


def time_round(n: int, layout: tuple, repeats: int, run_complete: bool, seed: int) -> dict:
    """Median seconds (and counts) per variant for one round of ``n`` clients."""
    rows = random_rows(n, layout, seed)
    segments = rows.segments()
    expected = [segment.sum(axis=0, dtype=segment.dtype) for segment in segments]
    keys = {"reuse": KeyDirectory(), "per_client": KeyDirectory()}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    counts: dict[str, tuple[int, int]] = {}
    params = ThreatModel().parameters(n)
    for rep in range(repeats):
        start = time.perf_counter()
        for segment in segments:
            segment.sum(axis=0, dtype=segment.dtype)
        times["plain"].append(time.perf_counter() - start)
        if run_complete:
            start = time.perf_counter()
            result = secure_sum(rows, round_id=rep)  # on the rows widened to 64-bit words
            times["complete"].append(time.perf_counter() - start)
            assert all((a == b).all() for a, b in zip(result.parts, expected, strict=True))
            counts["complete"] = (result.key_agreements, result.prg_streams)
        for variant in ("fresh", "reuse", "per_client"):
            work = rows.copy()  # masked in place, as MF-SecAvg does with its own encoding
            start = time.perf_counter()
            result = secure_sum_plus(
                work,
                round_id=rep,
                keys=keys.get(variant),
                per_client=variant == "per_client",
                overwrite_input=True,
                graph_seed=bytes(16),  # the same clients meet as the same graph (a cohort)
            )
            times[variant].append(time.perf_counter() - start)
            assert all((a == b).all() for a, b in zip(result.parts, expected, strict=True))
            counts[variant] = (result.key_agreements, result.prg_streams)
            del work, result
    medians = {v: statistics.median(t) for v, t in times.items() if t}
    return {
        "n": n,
        "seconds": medians,
        "counts": counts,
        "degree": params.degree,
        "t": params.threshold,
    }


def _median_seconds(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def estimate_complete(n: int, length: int) -> float:
    """Seconds of one complete-graph round of n clients from its operation counts and unit costs
    measured here: 3n(n−1) X25519 exchanges and HKDF derivations, 2n(n−1) share encryptions and
    decryptions, n(n+1) ChaCha20 streams of ``length`` words, per client two Shamir splits into n
    shares of degree t − 1 and one rebuild from t shares (t = ⌊n/2⌋ + 1, GF(2^521 − 1))."""
    from fedrec.federation.secagg import complete

    t = n // 2 + 1
    seed, secret = bytes(32), 2**255 + 12345
    prg = _median_seconds(lambda: complete.prg(seed, length), 20)
    hkdf = _median_seconds(lambda: complete._hkdf(seed, b"info"), 200)
    aead = _median_seconds(
        lambda: complete.ChaCha20Poly1305(seed).encrypt(bytes(12), bytes(140), b"ad"), 200
    )
    split_n, split_t = 200, 101
    split = _median_seconds(
        lambda: complete.shamir_split(secret, num_shares=split_n, threshold=split_t), 5
    ) / (split_n * split_t)
    shares = complete.shamir_split(secret, num_shares=split_t, threshold=split_t)
    combine = _median_seconds(lambda: complete.shamir_combine(shares), 5) / split_t**2
    pairs = n * (n - 1)
    return (
        3 * pairs * (x25519_seconds() + hkdf)
        + 2 * pairs * aead
        + n * (n + 1) * prg
        + 2 * n * n * t * split
        + n * t * t * combine
    )


def part1(args: argparse.Namespace, length: int) -> None:
    layout = gmf_layout()
    row_bytes = WordRows.row_bytes(layout)
    print(
        f"## One aggregation round: FedGMF's MF-SecAvg plaintext on ML-100K, {row_bytes:,} bytes "
        f"per client ({layout[0][1]} 64-bit network words, {layout[1][1]:,} 32-bit words of item "
        f"deltas and packed counts; {8 * length:,} bytes when all {length:,} words were 64-bit), "
        f"median of {args.repeats} rounds; machine load {os.getloadavg()[0]:.1f}\n"
    )
    rows = []
    sizes = sorted(set(args.clients))
    measured = [m for m in sizes if m <= args.old_max]
    check = max(measured) if measured and max(sizes) > args.old_max else None
    for n in sizes:
        repeats = args.repeats if n <= 100 else max(2, args.repeats // 2)
        rows.append(time_round(n, gmf_layout(n), repeats, n <= args.old_max, seed=n))
    print(
        "| clients | k / t | plain sum | complete graph | SecAgg+ per-round keys | SecAgg+ "
        "long-term keys (simulated) | SecAgg+ per client | X25519 per round (complete / "
        "SecAgg+ sim.) | PRG streams (complete / sim.) | complete ÷ SecAgg+ sim. | complete ÷ "
        "per client |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        n, sec = row["n"], row["seconds"]
        old = sec.get("complete")
        old_text = f"{1e3 * old:,.1f} ms" if old is not None else None
        counts_old = row["counts"].get("complete")
        if old is None:
            old = estimate_complete(n, length)
            old_text = f"≈ {old:,.0f} s" if old > 10 else f"≈ {1e3 * old:,.0f} ms"
            counts_old = (3 * n * (n - 1), n * (n + 1))  # no dropouts: shares, masks
        ka, streams = row["counts"]["reuse"]
        print(
            f"| {n:,} | {row['degree']} / {row['t']} | {1e3 * sec['plain']:.2f} ms | {old_text} | "
            f"{1e3 * sec['fresh']:,.1f} ms | {1e3 * sec['reuse']:,.1f} ms | "
            f"{1e3 * sec['per_client']:,.1f} ms | {counts_old[0]:,} / {ka:,} | "
            f"{counts_old[1]:,} / {streams:,} | {old / sec['reuse']:,.0f}× | "
            f"{old / sec['per_client']:,.0f}× |"
        )
    print(
        "\nk / t: SecAgg+'s degree and per-neighbourhood threshold for the default threat model "
        "(≤ 5% corrupted clients, ≤ 10% dropouts, privacy failure ≤ 2^-40). The complete graph "
        "uses a majority threshold. X25519 per round for the long-term keys counts first "
        "meetings only (the same clients every round here, with the same graph, as a fixed "
        "cohort meets: no X25519 after the first round). ≈: "
        "estimated from operation counts and unit costs measured here"
        + (
            f" (for {check} clients, measured above, the estimate is "
            f"{1e3 * estimate_complete(check, length):,.0f} ms: it leaves out Python overhead)."
            if check
            else "."
        )
        + "\n"
    )


# ------------------------------------------------------------------------------------------------
# Part 2


class Timed(Aggregator):
    """An aggregator that records, per aggregation round, its time, X25519 exchanges and key
    pairs generated, and checks secure results against MF-FedAvg on the same uploads (every
    16th round, outside the timing)."""

    name = "timed"

    def __init__(self, inner: Aggregator, *, check: bool = True) -> None:
        self.inner = inner
        self.check = check
        self.times: list[float] = []
        self.agreements: list[int] = []
        self.enrolments: list[int] = []
        self.at: list[int] = []  # the aggregation round of each timing
        self.rounds = 0

    def aggregate(
        self, *, items: torch.Tensor, network: torch.Tensor, updates: ClientUpdates
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys = getattr(self.inner, "keys", None)
        enrolled = keys.enrolments if keys is not None else 0
        start = time.perf_counter()
        result = self.inner.aggregate(items=items, network=network, updates=updates)
        self.times.append(time.perf_counter() - start)
        last = getattr(self.inner, "last", None)
        self.agreements.append(last.key_agreements if last is not None else 0)
        self.enrolments.append(keys.enrolments - enrolled if keys is not None else 0)
        self.at.append(self.rounds)
        self.rounds += 1
        if self.check and self.rounds % 16 == 1 and isinstance(self.inner, MFSecAvg):
            plain = MFFedAvg().aggregate(items=items, network=network, updates=updates)
            deviation = max(
                float((plain[0] - result[0]).abs().max()), float((plain[1] - result[1]).abs().max())
            )
            assert deviation < 1e-4, deviation
        return result


class Probe(Aggregator):
    """MF-FedAvg for the plain run, also timing the complete-graph protocol on the same
    uploads every ``old_every`` rounds (its time is kept out of the plain run's)."""

    name = "probe"

    def __init__(self, old_every: int) -> None:
        self.plain = Timed(MFFedAvg())
        self.complete = Timed(MFSecAvg(graph="complete", key_reuse=False))
        self.old_every = old_every
        self.probe_seconds = 0.0
        self.rounds = 0

    def aggregate(
        self, *, items: torch.Tensor, network: torch.Tensor, updates: ClientUpdates
    ) -> tuple[torch.Tensor, torch.Tensor]:
        plain = self.plain.aggregate(items=items, network=network, updates=updates)
        if self.rounds % self.old_every == 0:
            start = time.perf_counter()
            self.complete.aggregate(items=items, network=network, updates=updates)
            self.probe_seconds += time.perf_counter() - start
        self.rounds += 1
        return plain


def synthetic_ml100k(root: Path) -> Path:
    """An ML-100K-shaped synthetic data set (users, items and ratings per user as ML-100K)."""
    from fedrec.envs.datasets.synthetic import synthetic_log, write_ml100k

    log = synthetic_log(943, 1682, min_per_user=20, max_per_user=192, sparse_users=0, seed=0)
    write_ml100k(root / "ml-100k", log)
    return root


def distinct_pairs(
    num_users: int, clients: int, global_rounds: int, selection: str = "permutation", seed: int = 0
) -> int:
    """Distinct neighbour pairs over a run: the trainer's groups (a fresh permutation every
    global round, or fixed cohorts in a new order), one random graph per distinct group."""
    rng = np.random.default_rng(seed)
    per_global = math.ceil(num_users / clients)
    seen: set[int] = set()
    threat = ThreatModel()
    rounds = 1 if selection == "cohorts" else global_rounds  # cohorts: the same groups again
    for _ in range(rounds):
        for group in np.array_split(rng.permutation(num_users), per_global):
            params = threat.parameters(len(group))
            if params.complete:
                continue  # small rounds: complete-graph protocol, per-round keys
            nbrs = harary_neighbours(len(group), params.degree, rng.bytes(16))
            lo = np.repeat(group, params.degree)
            hi = group[nbrs.ravel()]
            seen.update((np.minimum(lo, hi) * num_users + np.maximum(lo, hi)).tolist())
    return len(seen)


NAMES = {
    "complete": "MF-SecAvg, complete graph (Bonawitz et al.)",
    "reuse": "MF-SecAvg, SecAgg+ (simulated)",
    "per_client": "MF-SecAvg, SecAgg+ per client",
}


def one_run(
    args: argparse.Namespace, data_dir: str | Path | None, selection: str, seed: int
) -> tuple[object, Probe, dict[str, Timed], list[float]]:
    """Three FedGMF runs of ``--global-rounds``, stepped in turn round by round: plain
    (MF-FedAvg, with the probe), MF-SecAvg simulated and MF-SecAvg per client."""
    from fedrec.train.fedncf import FedNCFConfig, FedNCFTrainer

    config = FedNCFConfig(
        model=NCFConfig(model="gmf"),
        global_rounds=400,
        eval_every=0,
        clients_per_round=20,
        selection=selection,  # type: ignore[arg-type]
        client_optimizer=args.client_optimizer,
        seed=seed,
    )
    probe = Probe(old_every=args.old_every)
    secure = {"reuse": Timed(MFSecAvg()), "per_client": Timed(MFSecAvg(per_client=True))}
    trainers = {}
    for name, aggregator in (("plain", probe), *secure.items()):
        trainer = FedNCFTrainer(
            dataset=args.dataset, data_dir=data_dir, config=config, progress=False
        )
        trainer.aggregator = aggregator
        trainers[name] = trainer
    step_times = []
    for _ in range(args.global_rounds * trainers["plain"].per_global):
        for name, trainer in trainers.items():
            before = probe.probe_seconds
            start = time.perf_counter()
            trainer.step()
            if name == "plain":
                step_times.append(time.perf_counter() - start - (probe.probe_seconds - before))
    return trainers["plain"], probe, secure, step_times


def part2(args: argparse.Namespace) -> None:
    from fedrec.envs.datasets.catalog import DatasetNotFoundError, load_prepared

    data_dir, note = args.data_dir, f"{args.dataset}"
    tmp = None
    try:
        load_prepared(args.dataset, data_dir)
    except DatasetNotFoundError:
        tmp = tempfile.TemporaryDirectory()
        data_dir = synthetic_ml100k(Path(tmp.name))
        note = "a synthetic data set of ML-100K's shape (ML-100K not found)"
    dh, keygen = x25519_seconds(), keygen_seconds()
    loads = []
    # per selection, per run: {row: (ms per round, added ms, added ÷ plain, projected ÷ plain,
    # X25519 per round)}
    table: dict[str, list[dict[str, tuple[float, ...]]]] = {s: [] for s in args.selection}
    pairs: dict[str, int] = {}
    per_global = 0
    for run in range(args.runs):
        for selection in args.selection:
            loads.append(os.getloadavg()[0])
            trainer, probe, secure, step_times = one_run(args, data_dir, selection, seed=run)
            per_global = trainer.per_global  # type: ignore[attr-defined]
            total_rounds = 400 * per_global
            num_users = trainer.num_users  # type: ignore[attr-defined]
            if selection not in pairs:
                pairs[selection] = distinct_pairs(num_users, 20, 400, selection)
            # steady state: the rounds after the first global round, where every client has
            # enrolled its long-term key (the complete graph keeps no keys: all its rounds)
            plain_round = statistics.median(step_times[per_global:])
            plain_agg = statistics.median(probe.plain.times[per_global:])
            rows: dict[str, tuple[float, ...]] = {
                "plain": (1e3 * plain_round, 1e3 * plain_agg, 0.0, 0.0, 0.0)
            }
            timed = {"complete": probe.complete, **secure}
            for name, record in timed.items():
                steady = [
                    i for i, r in enumerate(record.at) if name == "complete" or r >= per_global
                ]
                median = statistics.median(record.times[i] for i in steady)
                added = median - plain_agg
                projected = added
                if name != "complete":  # the X25519 and key generation of a whole run instead
                    per_pair = 2 if name == "per_client" else 1
                    non_dh = statistics.median(
                        record.times[i] - record.agreements[i] * dh - record.enrolments[i] * keygen
                        for i in steady
                    )
                    once = per_pair * pairs[selection] * dh + num_users * keygen
                    projected = non_dh - plain_agg + once / total_rounds
                rows[name] = (
                    1e3 * median,
                    1e3 * added,
                    added / plain_round,
                    projected / plain_round,
                    statistics.mean(record.agreements[i] for i in steady),
                )
            table[selection].append(rows)
    if tmp is not None:
        tmp.cleanup()

    def cell(values: list[float], fmt: str) -> str:
        middle = statistics.median(values)
        if len(values) == 1:
            return fmt.format(middle)
        return f"{fmt.format(middle)} ({fmt.format(min(values))}–{fmt.format(max(values))})"

    print(
        f"## A FedGMF run: {note}, 20 clients per aggregation round, {per_global} aggregation "
        f"rounds per global round; {args.global_rounds} global rounds measured per run, "
        f"{args.runs} runs (seeds 0..{args.runs - 1}) per selection, interleaved; machine load "
        f"{min(loads):.1f}–{max(loads):.1f} on {os.cpu_count()} CPUs; median (min–max) over "
        "the runs\n"
    )
    print(
        "| selection | | ms per aggregation round (aggregation alone for the protocols) | added ms per round | added ÷ plain training "
        "(measured) | added ÷ plain training over 400 global rounds (projected) | X25519 "
        "per round (measured) |"
    )
    print("|---|---|---|---|---|---|---|")
    for selection, runs in table.items():
        plain = [r["plain"] for r in runs]
        print(
            f"| {selection} | plain FedGMF training (local training + MF-FedAvg "
            f"{cell([p[1] for p in plain], '{:.2f}')} ms) | {cell([p[0] for p in plain], '{:.1f}')}"
            " | – | – | – | – |"
        )
        for name in ("complete", "reuse", "per_client"):
            values = [r[name] for r in runs]
            projected = (
                "–"
                if name == "complete"
                else f"**{cell([100 * v[3] for v in values], '{:.0f}%')}**"
            )
            print(
                f"| {selection} | {NAMES[name]} | {cell([v[0] for v in values], '{:.1f}')} | "
                f"{cell([v[1] for v in values], '{:.2f}')} | "
                f"{cell([100 * v[2] for v in values], '{:.0f}%')} | {projected} | "
                f"{statistics.median(v[4] for v in values):.0f} |"
            )
    print(
        f"\nX25519 exchange {1e6 * dh:.0f} µs, key pair {1e6 * keygen:.0f} µs. Three runs of "
        "the same configuration and seed are stepped in turn, round by round: plain (MF-FedAvg), "
        "MF-SecAvg simulated and MF-SecAvg per client, each aggregating its own run's uploads "
        "in the trainer (the complete-graph protocol is timed on the plain run's uploads every "
        f"{args.old_every}th round, outside its time). Measured: the rounds after the first "
        "global round (every client has enrolled its key; the complete graph keeps no keys: all "
        "its rounds). Added = a protocol's median aggregation time minus MF-FedAvg's; plain "
        "training = the plain run's median round, local training plus MF-FedAvg. Projected: "
        "the median time of those "
        "rounds without their X25519 exchanges and key generation, plus those of a whole "
        "400-global-round run spread over its rounds (every client's key pair, and one "
        "exchange per distinct neighbour pair: "
        + ", ".join(f"{sel} {count:,}" for sel, count in pairs.items())
        + "; two per pair per client).\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 100, 1000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--old-max", type=int, default=100, help="largest n timed for the complete graph"
    )
    parser.add_argument("--global-rounds", type=int, default=3, help="FedGMF rounds measured")
    parser.add_argument("--runs", type=int, default=3, help="FedGMF runs per selection (seeds)")
    parser.add_argument(
        "--selection",
        nargs="+",
        default=["permutation", "cohorts"],
        choices=["permutation", "cohorts"],
        help="client selections measured in part 2",
    )
    parser.add_argument(
        "--old-every", type=int, default=8, help="time the complete graph every this many rounds"
    )
    parser.add_argument(
        "--client-optimizer",
        default="fresh",
        help="FedNCFConfig.client_optimizer of the FedGMF runs (default fresh: a new Adam per "
        "participation, so the uploads are the item rows and network alone)",
    )
    parser.add_argument("--dataset", default="ml-100k")
    parser.add_argument("--data-dir")
    parser.add_argument("--skip-run", action="store_true", help="only part 1")
    parser.add_argument("--skip-round", action="store_true", help="only part 2")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not args.skip_round:
        part1(args, gmf_length())
    if not args.skip_run:
        part2(args)


if __name__ == "__main__":
    main()
