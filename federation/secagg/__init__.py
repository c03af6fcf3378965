"""Secure aggregation: the server learns the sum of the clients' inputs and nothing per client.

Two protocols compute the same exact sum (docs/secure_aggregation.md): the complete-graph
protocol of Bonawitz et al. (CCS 2017), where every pair of a round's clients masks, and SecAgg+
(Bell et al., CCS 2020), where only neighbours of a sparse random graph do, with long-term pair
keys. :func:`secure_sum` runs a round with either; :class:`MFSecAvg` is FedNCF's MF-FedAvg
computed with it (SecAgg+ by default).

The modules, each with one job, every one importing only those above it:

- :mod:`~fedrec.federation.secagg.outcome`: what a round ends with -- a
  :class:`SecureSumResult`, or an abort (:class:`SecAggAborted`, :class:`MalformedContribution`);
- :mod:`~fedrec.federation.secagg.inputs`: a round's inputs checked and encoded as integers
  (fixed point, :class:`WordRows` of 64- and 32-bit segments, the dropout sets);
- :mod:`~fedrec.federation.secagg.complete`: the complete-graph protocol (its Shamir sharing,
  ChaCha20 PRG, :class:`SecAggClient`, one round);
- :mod:`~fedrec.federation.secagg.graph`: SecAgg+'s graph (:class:`ThreatModel`, the Harary
  graph's degree and threshold, its random labelling);
- :mod:`~fedrec.federation.secagg.keys`: SecAgg+'s key material (:class:`KeyDirectory` of
  long-term pair keys, per-round pair secrets, Shamir shares of 128-bit keys);
- :mod:`~fedrec.federation.secagg.masking`: SecAgg+'s AES keystreams added to the rows in place;
- :mod:`~fedrec.federation.secagg.plus`: one SecAgg+ round (:func:`secure_sum_plus`), one
  function per protocol round;
- :mod:`~fedrec.federation.secagg.protocol`: :func:`secure_sum`, which picks the protocol;
- :mod:`~fedrec.federation.secagg.mf_plaintext`: MF-SecAvg's plaintext rows and their decoding;
- :mod:`~fedrec.federation.secagg.mf_secavg`: the :class:`MFSecAvg` aggregator.

Every public name is importable from the package itself, as before the split
(``from fedrec.federation.secagg import MFSecAvg, secure_sum_plus``).

What it may import: ``fedrec.federation.aggregators`` (the update types it aggregates) and
itself; nothing above the federation layer (tests/test_layers.py).
"""

from fedrec.federation.secagg.complete import (
    FIELD_PRIME,
    PublicKeys,
    SecAggClient,
    prg,
    secure_sum_complete,
    shamir_combine,
    shamir_split,
)
from fedrec.federation.secagg.graph import (
    GraphParameters,
    ThreatModel,
    harary_neighbours,
    harary_parameters,
    is_connected,
    secure_threshold,
)
from fedrec.federation.secagg.inputs import (
    WORD_DTYPES,
    WordRows,
    client_positions,
    client_words,
    decode_fixed_point,
    encode_fixed_point,
    word_matrix,
)
from fedrec.federation.secagg.keys import (
    SHARE_PRIME,
    KeyDirectory,
    key_limbs,
    lagrange_at_zero,
    limbs_key,
    round_secret,
    shamir_combine_limbs,
    shamir_combine_many,
    shamir_split_limbs,
)
from fedrec.federation.secagg.masking import aes_prg
from fedrec.federation.secagg.mf_plaintext import (
    check_updates,
    count_lane_dtype,
    decode_mf_secavg,
    fixed_point_rows,
    item_fraction_bits,
    mf_secavg_layout,
    mf_secavg_rows,
    mf_secavg_vector,
    upload_sizes,
)
from fedrec.federation.secagg.mf_secavg import MFSecAvg, SecureTables
from fedrec.federation.secagg.outcome import MalformedContribution, SecAggAborted, SecureSumResult
from fedrec.federation.secagg.plus import secure_sum_plus
from fedrec.federation.secagg.protocol import secure_sum

__all__ = [
    "FIELD_PRIME",
    "SHARE_PRIME",
    "WORD_DTYPES",
    "GraphParameters",
    "KeyDirectory",
    "MFSecAvg",
    "MalformedContribution",
    "PublicKeys",
    "SecAggAborted",
    "SecAggClient",
    "SecureSumResult",
    "SecureTables",
    "ThreatModel",
    "WordRows",
    "aes_prg",
    "check_updates",
    "client_positions",
    "client_words",
    "count_lane_dtype",
    "decode_fixed_point",
    "decode_mf_secavg",
    "encode_fixed_point",
    "fixed_point_rows",
    "harary_neighbours",
    "harary_parameters",
    "is_connected",
    "item_fraction_bits",
    "key_limbs",
    "lagrange_at_zero",
    "limbs_key",
    "mf_secavg_layout",
    "mf_secavg_rows",
    "mf_secavg_vector",
    "prg",
    "round_secret",
    "secure_sum",
    "secure_sum_complete",
    "secure_sum_plus",
    "secure_threshold",
    "shamir_combine",
    "shamir_combine_limbs",
    "shamir_combine_many",
    "shamir_split",
    "shamir_split_limbs",
    "upload_sizes",
    "word_matrix",
]
