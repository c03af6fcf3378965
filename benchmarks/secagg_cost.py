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
from fedrec.federation.secagg import MFSecAvg, secure_sum, upload_sizes
from fedrec.federation.secagg_plus import (
    KeyDirectory,
    ThreatModel,
    harary_neighbours,
    secure_sum_plus,
)

VARIANTS = ("plain", "complete", "fresh", "reuse", "per_client")


def gmf_length(num_items: int = 1682) -> int:
    """Words of FedGMF's MF-SecAvg plaintext on an ML-100K-sized data set."""
    config = NCFConfig(model="gmf")
    sizes = upload_sizes(
        network_size=config.network_size, num_items=num_items, item_width=config.item_width
    )
    return sum(sizes.values())


def x25519_seconds(repeats: int = 200) -> float:
    """Median seconds of one X25519 exchange (public key object already parsed)."""
    key, peer = X25519PrivateKey.generate(), X25519PrivateKey.generate().public_key()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        key.exchange(peer)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ------------------------------------------------------------------------------------------------
# Part 1


def time_round(n: int, length: int, repeats: int, run_complete: bool, seed: int) -> dict:
    """Median seconds (and counts) per variant for one round of ``n`` clients."""
    rng = np.random.default_rng(seed)
    vectors = rng.integers(0, 2**64, (n, length), dtype=np.uint64)
    expected = vectors.sum(axis=0, dtype=np.uint64)
    keys = {"reuse": KeyDirectory(), "per_client": KeyDirectory()}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    counts: dict[str, tuple[int, int]] = {}
    params = ThreatModel().parameters(n)
    for rep in range(repeats):
        start = time.perf_counter()
        vectors.sum(axis=0, dtype=np.uint64)
        times["plain"].append(time.perf_counter() - start)
        if run_complete:
            rows = list(vectors)
            start = time.perf_counter()
            result = secure_sum(rows, round_id=rep)
            times["complete"].append(time.perf_counter() - start)
            assert (result.total == expected).all()
            counts["complete"] = (result.key_agreements, result.prg_streams)
        for variant in ("fresh", "reuse", "per_client"):
            work = vectors.copy()  # masked in place, as MF-SecAvg does with its own encoding
            start = time.perf_counter()
            result = secure_sum_plus(
                work,
                round_id=rep,
                keys=keys.get(variant),
                per_client=variant == "per_client",
                overwrite_input=True,
            )
            times[variant].append(time.perf_counter() - start)
            assert (result.total == expected).all()
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
    from fedrec.federation import secagg

    t = n // 2 + 1
    seed, secret = bytes(32), 2**255 + 12345
    prg = _median_seconds(lambda: secagg.prg(seed, length), 20)
    hkdf = _median_seconds(lambda: secagg._hkdf(seed, b"info"), 200)
    aead = _median_seconds(
        lambda: secagg.ChaCha20Poly1305(seed).encrypt(bytes(12), bytes(140), b"ad"), 200
    )
    split_n, split_t = 200, 101
    split = _median_seconds(
        lambda: secagg.shamir_split(secret, num_shares=split_n, threshold=split_t), 5
    ) / (split_n * split_t)
    shares = secagg.shamir_split(secret, num_shares=split_t, threshold=split_t)
    combine = _median_seconds(lambda: secagg.shamir_combine(shares), 5) / split_t**2
    pairs = n * (n - 1)
    return (
        3 * pairs * (x25519_seconds() + hkdf)
        + 2 * pairs * aead
        + n * (n + 1) * prg
        + 2 * n * n * t * split
        + n * t * t * combine
    )


def part1(args: argparse.Namespace, length: int) -> None:
    print(
        f"## One aggregation round: {length:,} 64-bit words per client (FedGMF's MF-SecAvg "
        f"plaintext on ML-100K), median of {args.repeats} rounds\n"
    )
    rows = []
    sizes = sorted(set(args.clients))
    measured = [m for m in sizes if m <= args.old_max]
    check = max(measured) if measured and max(sizes) > args.old_max else None
    for n in sizes:
        repeats = args.repeats if n <= 100 else max(2, args.repeats // 2)
        rows.append(time_round(n, length, repeats, n <= args.old_max, seed=n))
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
        "meetings only (the same clients every round here, each round a new random graph). ≈: "
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


class Probe(Aggregator):
    """MF-FedAvg for the run, timing the secure aggregators on the same uploads."""

    name = "probe"

    def __init__(self, old_every: int) -> None:
        self.secure = {
            "reuse": MFSecAvg(),
            "per_client": MFSecAvg(per_client=True),
            "complete": MFSecAvg(graph="complete", key_reuse=False),
        }
        self.old_every = old_every
        self.times: dict[str, list[float]] = {"plain": [], **{k: [] for k in self.secure}}
        self.agreements: dict[str, list[int]] = {k: [] for k in self.secure}
        self.probe_seconds = 0.0
        self.rounds = 0

    def aggregate(
        self, *, items: torch.Tensor, network: torch.Tensor, updates: ClientUpdates
    ) -> tuple[torch.Tensor, torch.Tensor]:
        start = time.perf_counter()
        plain = MFFedAvg().aggregate(items=items, network=network, updates=updates)
        self.times["plain"].append(time.perf_counter() - start)
        probe_start = time.perf_counter()
        for name, aggregator in self.secure.items():
            if name == "complete" and self.rounds % self.old_every:
                continue
            start = time.perf_counter()
            secure = aggregator.aggregate(items=items, network=network, updates=updates)
            self.times[name].append(time.perf_counter() - start)
            assert aggregator.last is not None
            self.agreements[name].append(aggregator.last.key_agreements)
            deviation = max(
                float((plain[0] - secure[0]).abs().max()), float((plain[1] - secure[1]).abs().max())
            )
            assert deviation < 1e-4, deviation
        self.probe_seconds += time.perf_counter() - probe_start
        self.rounds += 1
        return plain


def synthetic_ml100k(root: Path) -> Path:
    """An ML-100K-shaped synthetic data set (users, items and ratings per user as ML-100K)."""
    from fedrec.envs.datasets.synthetic import synthetic_log, write_ml100k

    log = synthetic_log(943, 1682, min_per_user=20, max_per_user=192, sparse_users=0, seed=0)
    write_ml100k(root / "ml-100k", log)
    return root


def distinct_pairs(num_users: int, clients: int, global_rounds: int, seed: int = 0) -> int:
    """Distinct neighbour pairs over a run: the trainer's groups, a fresh random graph each."""
    rng = np.random.default_rng(seed)
    per_global = math.ceil(num_users / clients)
    seen: set[int] = set()
    threat = ThreatModel()
    for _ in range(global_rounds):
        for group in np.array_split(rng.permutation(num_users), per_global):
            params = threat.parameters(len(group))
            if params.complete:
                continue  # small rounds: complete-graph protocol, per-round keys
            nbrs = harary_neighbours(len(group), params.degree, rng.bytes(16))
            lo = np.repeat(group, params.degree)
            hi = group[nbrs.ravel()]
            seen.update((np.minimum(lo, hi) * num_users + np.maximum(lo, hi)).tolist())
    return len(seen)


def part2(args: argparse.Namespace) -> None:
    from fedrec.envs.datasets.catalog import DatasetNotFoundError, load_prepared
    from fedrec.train.fedncf import FedNCFConfig, FedNCFTrainer

    data_dir, note = args.data_dir, f"{args.dataset}"
    tmp = None
    try:
        load_prepared(args.dataset, data_dir)
    except DatasetNotFoundError:
        tmp = tempfile.TemporaryDirectory()
        data_dir = synthetic_ml100k(Path(tmp.name))
        note = "a synthetic data set of ML-100K's shape (ML-100K not found)"
    config = FedNCFConfig(
        model=NCFConfig(model="gmf"), global_rounds=400, eval_every=0, clients_per_round=20
    )
    trainer = FedNCFTrainer(dataset=args.dataset, data_dir=data_dir, config=config, progress=False)
    probe = Probe(old_every=8)
    trainer.aggregator = probe
    rounds = args.global_rounds * trainer.per_global
    step_times = []
    for _ in range(rounds):
        before = probe.probe_seconds
        start = time.perf_counter()
        trainer.step()
        step_times.append(time.perf_counter() - start - (probe.probe_seconds - before))
    dh = x25519_seconds()
    plain_round = statistics.median(step_times)
    plain_agg = statistics.median(probe.times["plain"])
    total_rounds = 400 * trainer.per_global
    pairs_400 = distinct_pairs(trainer.num_users, 20, 400)
    if tmp is not None:
        tmp.cleanup()

    print(
        f"## A FedGMF run: {note}, 20 clients per aggregation round, {trainer.per_global} "
        f"aggregation rounds per global round; {rounds} rounds measured "
        f"({args.global_rounds} global rounds), machine load {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} CPUs\n"
    )
    print(
        "| | ms per aggregation round | added ms per round | added s per global round | "
        "added min over 400 global rounds | added ÷ plain training |"
    )
    print("|---|---|---|---|---|---|")
    plain_total = plain_round * total_rounds
    print(
        f"| plain FedGMF training (local training + MF-FedAvg {1e3 * plain_agg:.2f} ms) | "
        f"{1e3 * plain_round:.1f} | – | – | {plain_total / 60:.1f} min in all | – |"
    )
    names = {
        "complete": "MF-SecAvg, complete graph (Bonawitz et al.)",
        "reuse": "MF-SecAvg, SecAgg+ (simulated)",
        "per_client": "MF-SecAvg, SecAgg+ per client",
    }
    for name in ("complete", "reuse", "per_client"):
        secure = statistics.median(probe.times[name])
        added = secure - plain_agg
        measured = added * total_rounds
        line = (
            f"| {names[name]} | {1e3 * secure:.1f} | {1e3 * added:.1f} | "
            f"{added * trainer.per_global:.2f} | {measured / 60:.1f} | "
            f"{added / plain_round:.0%} |"
        )
        print(line)
        if name != "complete":
            # replace the measured rounds' key agreements by a 400-round schedule's
            per_pair = 2 if name == "per_client" else 1
            agreements = statistics.mean(probe.agreements[name])
            non_dh = statistics.median(
                t - a * dh for t, a in zip(probe.times[name], probe.agreements[name], strict=True)
            )
            total = (non_dh - plain_agg) * total_rounds + per_pair * pairs_400 * dh
            print(
                f"| ↳ projected with pair keys reused over 400 global rounds "
                f"({per_pair * pairs_400:,} X25519 in all; {agreements:.0f} per round measured) | "
                f"– | {1e3 * total / total_rounds:.1f} | {total / 400:.2f} | {total / 60:.1f} | "
                f"{total / plain_total:.0%} |"
            )
    print(
        f"\nX25519 exchange: {1e6 * dh:.0f} µs. Added = a protocol's median aggregation time "
        "minus MF-FedAvg's, per aggregation round; the complete-graph protocol was timed on every "
        "8th round."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 100, 1000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--old-max", type=int, default=100, help="largest n timed for the complete graph"
    )
    parser.add_argument("--global-rounds", type=int, default=3, help="FedGMF rounds measured")
    parser.add_argument("--dataset", default="ml-100k")
    parser.add_argument("--data-dir")
    parser.add_argument("--skip-run", action="store_true", help="only part 1")
    args = parser.parse_args()
    torch.set_num_threads(1)
    part1(args, gmf_length())
    if not args.skip_run:
        part2(args)


if __name__ == "__main__":
    main()
