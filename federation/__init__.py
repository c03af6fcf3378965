"""fedrec.federation: the FedSlate message channel (validated, accounted, pluggable transport)
and the FedNCF aggregation rules."""

from fedrec.federation.channel import Channel, InProcessTransport, Transport
from fedrec.federation.messages import (
    SERVER,
    InvalidMessage,
    Message,
    MessageKind,
    PrivacyViolation,
)

__all__ = [
    "SERVER",
    "Channel",
    "InProcessTransport",
    "InvalidMessage",
    "Message",
    "MessageKind",
    "PrivacyViolation",
    "Transport",
]
