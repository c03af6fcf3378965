"""The messages that may cross a party boundary in FedSlate, and their validation.

FedSlate (Deng et al., 2024) is vertical federated RL: K platforms serve the same user and may not
share raw data. Each platform keeps its observations, transitions, rewards and Q network; the
federated server keeps the global network F. The *only* things that travel are:

================== ==================== ============================ ==============================
kind               direction            payload                      why
================== ==================== ============================ ==============================
Q_VALUES           platform -> server   (B, N) float32               Q_k(s_k) of the online net
TARGET_Q_VALUES    platform -> server   (B, N) float32               Q_k^-(s'_k) of the target net
FEDERATED_Q_VALUES server -> platform   (B, N) float32               F([Q_k; Q_others]) (online/target)
Q_GRADIENTS        both ways            (B, N) float32               dLoss/dQ (split back-propagation)
TD_TARGETS         platform <-> server  (B,) float32                 a feedback platform's TD label
SAMPLE_INDICES     server -> platform   (B,) int64                   replay rows of the shared batch
================== ==================== ============================ ==============================

Anything else -- a dict, a tensor with a gradient graph, network parameters, observations,
rewards, a ragged or non-finite array -- is refused when the message is built: a payload that is
not a plain ndarray, or a kind that is not a :class:`MessageKind`, raises :class:`PrivacyViolation`;
a payload of the wrong shape, dtype or with NaN/inf raises :class:`InvalidMessage`. Q-value
gradients have the shape of Q values and reveal no more than them (which item was clicked, as any
split-learning gradient does); TD labels are the one quantity derived from a reward that the
protocol sends (a platform without feedback learns from the feedback platform's label: see
``docs/fedslate.md``, "Protocol, in words").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

SERVER = "server"


class PrivacyViolation(ValueError):
    """A message would carry something the FedSlate privacy contract does not allow."""


class InvalidMessage(ValueError):
    """A message of an allowed kind whose payload is malformed (shape, dtype, non-finite)."""


class MessageKind(enum.Enum):
    """What a message carries; see the module table for direction and shape."""

    Q_VALUES = "q_values"
    TARGET_Q_VALUES = "target_q_values"
    FEDERATED_Q_VALUES = "federated_q_values"
    Q_GRADIENTS = "q_gradients"
    TD_TARGETS = "td_targets"
    SAMPLE_INDICES = "sample_indices"


#: kind -> (payload ndim, dtype). Q-like payloads are (batch, num_candidates) float32.
PAYLOAD_SPEC: dict[MessageKind, tuple[int, np.dtype]] = {
    MessageKind.Q_VALUES: (2, np.dtype(np.float32)),
    MessageKind.TARGET_Q_VALUES: (2, np.dtype(np.float32)),
    MessageKind.FEDERATED_Q_VALUES: (2, np.dtype(np.float32)),
    MessageKind.Q_GRADIENTS: (2, np.dtype(np.float32)),
    MessageKind.TD_TARGETS: (1, np.dtype(np.float32)),
    MessageKind.SAMPLE_INDICES: (1, np.dtype(np.int64)),
}
#: Kinds only the server may send, and kinds only a platform may send.
SERVER_ONLY = frozenset({MessageKind.FEDERATED_Q_VALUES, MessageKind.SAMPLE_INDICES})
PLATFORM_ONLY = frozenset({MessageKind.Q_VALUES, MessageKind.TARGET_Q_VALUES})


@dataclass(frozen=True)
class Message:
    """One validated message. Build it with :meth:`Message.make` (which validates).

    ``step`` is the sender's learning or acting step (bookkeeping only); ``num_candidates`` is
    the expected trailing size of Q-like payloads (checked when given).
    """

    kind: MessageKind
    sender: str
    receiver: str
    step: int
    payload: np.ndarray

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: the payload only (headers are a constant per message)."""
        return int(self.payload.nbytes)

    @classmethod
    def make(
        cls,
        kind: MessageKind,
        *,
        sender: str,
        receiver: str,
        step: int,
        payload: object,
        num_candidates: int | None = None,
    ) -> Message:
        """Validate and build a message; raises :class:`PrivacyViolation` or :class:`InvalidMessage`."""
        if not isinstance(kind, MessageKind):
            raise PrivacyViolation(
                f"message kind {kind!r} is not allowed across parties; only "
                f"{[k.name for k in MessageKind]} may be sent"
            )
        if not isinstance(sender, str) or not isinstance(receiver, str) or sender == receiver:
            raise InvalidMessage(f"{kind.name}: bad sender/receiver {sender!r} -> {receiver!r}")
        if (sender == SERVER) == (receiver == SERVER):
            raise InvalidMessage(
                f"{kind.name}: every message goes between a platform and the server, "
                f"got {sender!r} -> {receiver!r}"
            )
        if kind in SERVER_ONLY and sender != SERVER:
            raise PrivacyViolation(f"{kind.name} may only be sent by the server, not {sender!r}")
        if kind in PLATFORM_ONLY and sender == SERVER:
            raise PrivacyViolation(f"{kind.name} may only be sent by a platform, not the server")
        if not isinstance(payload, np.ndarray) or type(payload) is not np.ndarray:
            raise PrivacyViolation(
                f"{kind.name} from {sender!r}: payload must be a plain numpy array of "
                f"{kind.value}, got {type(payload).__name__} (parameters, states, rewards, dicts "
                "and tensors never cross a party boundary)"
            )
        ndim, dtype = PAYLOAD_SPEC[kind]
        if payload.dtype != dtype:
            raise InvalidMessage(
                f"{kind.name} from {sender!r}: dtype must be {dtype}, got {payload.dtype}"
            )
        if payload.ndim != ndim or payload.shape[0] < 1:
            raise InvalidMessage(
                f"{kind.name} from {sender!r}: expected a {ndim}-d array with >= 1 row, "
                f"got shape {payload.shape}"
            )
        if ndim == 2 and num_candidates is not None and payload.shape[1] != num_candidates:
            raise InvalidMessage(
                f"{kind.name} from {sender!r}: expected {num_candidates} values per row "
                f"(one per candidate), got shape {payload.shape}"
            )
        if payload.dtype.kind == "f" and not np.isfinite(payload).all():
            raise InvalidMessage(f"{kind.name} from {sender!r}: payload has NaN or inf values")
        if kind is MessageKind.SAMPLE_INDICES and payload.min() < 0:
            raise InvalidMessage(f"{kind.name}: negative replay index")
        frozen = payload.copy()  # the receiver gets its own copy; the sender's array stays private
        frozen.flags.writeable = False
        return cls(kind, sender, receiver, int(step), frozen)
