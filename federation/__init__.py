"""fedrec.federation: the layer every cross-party message goes through.

What lives here: the validated, byte-counted channel (:mod:`~fedrec.federation.channel`) and
its message kinds and contracts (:mod:`~fedrec.federation.messages`), the gRPC transport
(:mod:`~fedrec.federation.grpc_transport`), the aggregation rules (FedAvg, MF-FedAvg, ...:
:mod:`~fedrec.federation.aggregators`), secure aggregation (:mod:`fedrec.federation.secagg`),
the process supervisor of parties and nodes, and the adapters to Flower.

What it may import: ``fedrec.envs`` and ``fedrec.util`` only; agents and trainers build on it,
never the other way round (checked by tests/test_layers.py).
"""

from fedrec.federation.channel import Channel, InProcessTransport, Transport
from fedrec.federation.messages import (
    FEDSLATE_KINDS,
    PARAMETER_SHARING_KINDS,
    SERVER,
    InvalidMessage,
    Message,
    MessageKind,
    PrivacyViolation,
)

__all__ = [
    "FEDSLATE_KINDS",
    "PARAMETER_SHARING_KINDS",
    "SERVER",
    "Channel",
    "InProcessTransport",
    "InvalidMessage",
    "Message",
    "MessageKind",
    "PrivacyViolation",
    "Transport",
]
