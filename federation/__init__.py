"""fedrec.federation: the FedSlate message channel (validated, accounted, pluggable transport)
and the FedNCF aggregation rules."""

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
