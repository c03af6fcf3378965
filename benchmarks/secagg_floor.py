"""The floor under secure aggregation's cost in FedNCF training: generating and adding the masks.

Usage: ``python benchmarks/secagg_floor.py [--models gmf] [--client-optimizers fresh federated]
[--simulations batched compiled] [--global-rounds 2] [--out PATH] [--overwrite]``: writes the JSON
to ``--out`` (default ``runs/benchmarks/secagg_floor/secagg_floor.json``; the committed one is
``results/fedncf/secagg_floor.json``; an earlier run's file is replaced only with ``--overwrite``).

For every model, client optimiser and client simulation it trains FedNCF on ML-100K (20 clients
per aggregation round, seed 0, cohort selection so that pair keys are agreed in the first global
round only, the best case for the protocol) for ``--global-rounds`` global rounds, twice: with
MF-FedAvg (plain) and with MF-SecAvg (SecAgg+, long-term pair keys). Over the last global round
it reports, per aggregation round (medians):

* **plain**: the trainer's time of a round (sampling, local training, aggregation);
* **secure added**: the secure round's time minus the plain one's;
* **floor**: what no masking protocol of this shape can go below here. The protocol's keystreams
  are counted (a wrapper around the masker's ``expand``: every client's pair streams and self
  stream, and the server's re-expansion of the survivors' self streams) with their length, and
  each is priced at the time this machine takes to expand one AES keystream of that length and
  add it to a row of words (median of 200 each). It leaves out everything else the protocol does
  (key agreement, secret shares, encoding, decoding), so the real cost is above it.

``floor / plain`` above 25% means the issue's target ("secure aggregation adds at most 25% of the
plain training time") cannot be met by any faster implementation of the same protocol on this
machine: the bytes to mask are fixed by the plaintext (every item row, to hide which rows a client
touched) and by the graph's degree (fixed by the threat model).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from fedrec.agents.ncf import NCFConfig
from fedrec.experiments.harness import add_out_arguments, claim_outputs, run_script, script_out
from fedrec.federation.secagg import masking
from fedrec.train.fedncf import FedNCFConfig, FedNCFTrainer


def round_times(
    model: str, *, optimizer: str, simulation: str, aggregator: str, global_rounds: int
) -> tuple[list[float], list[int]]:
    """Seconds of each aggregation round of the last global round, and the keystream lengths
    (bytes) the protocol expanded in those rounds."""
    config = FedNCFConfig(
        model=NCFConfig(model=model),
        aggregator=aggregator,
        client_optimizer=optimizer,  # type: ignore[arg-type]
        simulation=simulation,  # type: ignore[arg-type]
        selection="cohorts",
        global_rounds=global_rounds,
        eval_every=0,
    )
    run = FedNCFTrainer(dataset="ml-100k", config=config, progress=False)
    streams: list[int] = []
    expand = masking.Masker.expand

    def counted(self: Any, key: bytes) -> Any:
        streams.append(len(self.zeros))
        return expand(self, key)

    masking.Masker.expand = counted  # type: ignore[method-assign]
    times: list[float] = []
    try:
        for r in range(run.total_rounds - 1):  # the last round evaluates
            if r == run.total_rounds - run.per_global:
                streams.clear()
            before = run.train_seconds
            run.step()
            if r >= run.total_rounds - run.per_global:
                times.append(run.train_seconds - before)
    finally:
        masking.Masker.expand = expand  # type: ignore[method-assign]
    return times, streams


def stream_cost(length: int, repeats: int = 200) -> float:
    """Seconds to expand one AES keystream of ``length`` bytes and add it to a row of words."""
    zeros, nonce = bytes(length), bytes(12)
    row = np.zeros(length // 8, np.uint64)
    cipher = AESGCM(os.urandom(16))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        stream = cipher.encrypt(nonce, zeros, None)
        np.add(row, np.frombuffer(stream, np.uint64, length // 8), out=row)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gmf"])
    parser.add_argument("--client-optimizers", nargs="+", default=["fresh", "federated"])
    parser.add_argument("--simulations", nargs="+", default=["batched", "compiled"])
    parser.add_argument("--global-rounds", type=int, default=2)
    add_out_arguments(
        parser, "secagg_floor", name="secagg_floor.json", what="the JSON ('' for none)"
    )
    args = parser.parse_args()
    if args.out != "":
        args.out = script_out("secagg_floor", args.out, "secagg_floor.json")
        claim_outputs([args.out], overwrite=args.overwrite)
    rows = []
    lines = [
        "| model | client Adam | simulation | plain ms / round | secure added ms | floor ms "
        "(streams x KB) | floor / plain | secure added / plain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model in args.models:
        for optimizer in args.client_optimizers:
            for simulation in args.simulations:
                load = os.getloadavg()[0]
                kwargs = {"optimizer": optimizer, "simulation": simulation}
                plain, _ = round_times(
                    model, aggregator="mf-fedavg", global_rounds=args.global_rounds, **kwargs
                )
                secure, streams = round_times(
                    model, aggregator="mf-secavg", global_rounds=args.global_rounds, **kwargs
                )
                per_round = len(streams) / len(secure)
                length = statistics.median(streams)
                floor = per_round * stream_cost(int(length))
                plain_ms, secure_ms = (
                    1e3 * statistics.median(plain),
                    1e3 * statistics.median(secure),
                )
                row = {
                    "model": model,
                    "client_optimizer": optimizer,
                    "simulation": simulation,
                    "plain_ms": plain_ms,
                    "secure_ms": secure_ms,
                    "added_ms": secure_ms - plain_ms,
                    "streams_per_round": per_round,
                    "stream_bytes": length,
                    "floor_ms": 1e3 * floor,
                    "load": [round(load, 2), round(os.getloadavg()[0], 2)],
                }
                rows.append(row)
                line = (
                    f"| {model} | {optimizer} | {simulation} | {plain_ms:.1f} | "
                    f"{row['added_ms']:.1f} | {row['floor_ms']:.1f} ({per_round:.0f} x "
                    f"{length / 1024:.0f}) | {row['floor_ms'] / plain_ms:.0%} | "
                    f"{row['added_ms'] / plain_ms:.0%} |"
                )
                lines.append(line)
                print(line, flush=True)
    print("\n".join(lines))
    if args.out:
        report = {
            "command": "python benchmarks/secagg_floor.py "
            + " ".join(
                f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                for k, v in vars(args).items()
                if k not in ("out", "overwrite")
            ),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "rows": rows,
            "table": lines,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    run_script(main)
