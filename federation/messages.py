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
MODEL_PARAMETERS   platform <-> server  (P,) float32                 a rule's parameters (FedCEM)
================== ==================== ============================ ==============================

The first six kinds are FedSlate's contract (:data:`FEDSLATE_KINDS`), the default of every
:class:`~fedrec.federation.channel.Channel`. ``MODEL_PARAMETERS`` is a different contract: a
channel carries it only when it is opened with :data:`PARAMETER_SHARING_KINDS` (FedCEM, in which
platforms share only the parameters of a rule distribution; see ``docs/fedcem.md``). A channel
refuses every kind outside its contract with :class:`PrivacyViolation`.

Anything else -- a dict, a tensor with a gradient graph, observations,
rewards, a ragged or non-finite array -- is refused when the message is built: a payload that is
not a plain ndarray, or a kind that is not a :class:`MessageKind`, raises :class:`PrivacyViolation`;
a payload of the wrong shape, dtype or with NaN/inf, or larger than the channel's size limit
(:data:`DEFAULT_MAX_MESSAGE_BYTES`, :data:`DEFAULT_MAX_MESSAGE_ROWS`), raises
:class:`InvalidMessage`. A :class:`Message` can only be built by :meth:`Message.make` (a hand-made
``Message(...)`` is refused), and :class:`fedrec.federation.channel.Channel` validates every
message again when it is received, so no path around the validation exists. Q-value
gradients have the shape of Q values and reveal no more than them (which item was clicked, as any
split-learning gradient does); TD labels are the one quantity derived from a reward that the
protocol sends (a platform without feedback learns from the feedback platform's label: see
``docs/fedslate.md``, "Protocol, in words").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

SERVER = "server"

#: Default size limit of one message's payload: 64 MiB. The largest message the built-in FedSlate
#: sends at its largest settings -- Q values of 500 candidates for the 500 users of a final
#: evaluation batch (500 x 500 float32 = 1 MB; a learning round's batch of 32 rows is 64 kB, an
#: acting step of the default 16 users 32 kB, whatever the number of platforms) -- is 67x below it,
#: and at 500 candidates it still allows 33,554 users acting at once. It stops a runaway or hostile
#: payload (the 2,000,000-row message of a fuzzing run) before it is copied or counted.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 2**20
#: Default limit on a payload's rows (users or replay rows of one message): 65,536, 4096x the
#: default 16 users and 131x an evaluation batch of 500 users.
DEFAULT_MAX_MESSAGE_ROWS = 2**16
#: Only :meth:`Message.make` holds this token; ``Message.__post_init__`` refuses any other.
_SEAL = object()


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
    MODEL_PARAMETERS = "model_parameters"


#: kind -> (payload ndim, dtype). Q-like payloads are (batch, num_candidates) float32.
PAYLOAD_SPEC: dict[MessageKind, tuple[int, np.dtype]] = {
    MessageKind.Q_VALUES: (2, np.dtype(np.float32)),
    MessageKind.TARGET_Q_VALUES: (2, np.dtype(np.float32)),
    MessageKind.FEDERATED_Q_VALUES: (2, np.dtype(np.float32)),
    MessageKind.Q_GRADIENTS: (2, np.dtype(np.float32)),
    MessageKind.TD_TARGETS: (1, np.dtype(np.float32)),
    MessageKind.SAMPLE_INDICES: (1, np.dtype(np.int64)),
    MessageKind.MODEL_PARAMETERS: (1, np.dtype(np.float32)),
}
#: FedSlate's contract: per-candidate values, their gradients, TD labels and replay indices;
#: no model parameters. The default contract of a channel.
FEDSLATE_KINDS = frozenset(MessageKind) - {MessageKind.MODEL_PARAMETERS}
#: The parameter-sharing contract (FedCEM): model weights only; no per-user value crosses.
PARAMETER_SHARING_KINDS = frozenset({MessageKind.MODEL_PARAMETERS})
#: Kinds only the server may send, and kinds only a platform may send.
SERVER_ONLY = frozenset({MessageKind.FEDERATED_Q_VALUES, MessageKind.SAMPLE_INDICES})
PLATFORM_ONLY = frozenset({MessageKind.Q_VALUES, MessageKind.TARGET_Q_VALUES})


def validate_payload(
    kind: object,
    *,
    sender: object,
    receiver: object,
    payload: object,
    num_candidates: int | None = None,
    max_bytes: int | None = DEFAULT_MAX_MESSAGE_BYTES,
    max_rows: int | None = DEFAULT_MAX_MESSAGE_ROWS,
) -> None:
    """Check one message against the contract; raises :class:`PrivacyViolation` or
    :class:`InvalidMessage` (see the module doc). ``None`` limits are not checked.

    The cheap checks (kind, parties, type, dtype, shape, size) come before the ones that read
    every value, so an oversized payload is refused without being scanned or copied.
    """
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
    if type(payload) is not np.ndarray:
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
    if max_rows is not None and payload.shape[0] > max_rows:
        raise InvalidMessage(
            f"{kind.name} from {sender!r}: {payload.shape[0]} rows exceed the channel's limit "
            f"of {max_rows} rows per message"
        )
    if max_bytes is not None and payload.nbytes > max_bytes:
        raise InvalidMessage(
            f"{kind.name} from {sender!r}: {payload.nbytes} bytes exceed the channel's limit "
            f"of {max_bytes} bytes per message"
        )
    if payload.dtype.kind == "f" and not np.isfinite(payload).all():
        raise InvalidMessage(f"{kind.name} from {sender!r}: payload has NaN or inf values")
    if kind is MessageKind.SAMPLE_INDICES and payload.min() < 0:
        raise InvalidMessage(f"{kind.name}: negative replay index")


@dataclass(frozen=True)
class Message:
    """One validated message, built only by :meth:`Message.make` (which validates); a
    ``Message(...)`` made by hand, or copied with ``dataclasses.replace``, is refused
    (:class:`InvalidMessage`) or re-validated when received.

    ``step`` is the sender's learning or acting step (bookkeeping only). The payload is the
    message's own read-only copy.
    """

    kind: MessageKind
    sender: str
    receiver: str
    step: int
    payload: np.ndarray
    _seal: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._seal is not _SEAL:
            raise InvalidMessage(
                "a Message cannot be built by hand: use Message.make (or Channel.send), which "
                "validates it"
            )

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: the payload only (headers are a constant per message)."""
        return int(self.payload.nbytes)

    def validate(
        self,
        *,
        num_candidates: int | None = None,
        max_bytes: int | None = DEFAULT_MAX_MESSAGE_BYTES,
        max_rows: int | None = DEFAULT_MAX_MESSAGE_ROWS,
    ) -> None:
        """Check this message again (what a receiver does; see :func:`validate_payload`): also
        that its payload is still the read-only copy :meth:`make` sealed."""
        if self._seal is not _SEAL:
            raise InvalidMessage("a Message not built by Message.make")
        validate_payload(
            self.kind,
            sender=self.sender,
            receiver=self.receiver,
            payload=self.payload,
            num_candidates=num_candidates,
            max_bytes=max_bytes,
            max_rows=max_rows,
        )
        if self.payload.flags.writeable or self.payload.base is not None:
            raise InvalidMessage(
                f"{self.kind.name} from {self.sender!r}: the payload is not the message's own "
                "read-only copy (a Message altered after Message.make)"
            )
        if type(self.step) is not int:
            raise InvalidMessage(f"{self.kind.name}: step must be an int, got {self.step!r}")

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
        max_bytes: int | None = DEFAULT_MAX_MESSAGE_BYTES,
        max_rows: int | None = DEFAULT_MAX_MESSAGE_ROWS,
    ) -> Message:
        """Validate and build a message; raises :class:`PrivacyViolation` or :class:`InvalidMessage`.

        ``num_candidates`` is the expected trailing size of Q-like payloads (checked when given);
        ``max_bytes`` and ``max_rows`` limit the payload's size (``None``: no limit).
        """
        validate_payload(
            kind,
            sender=sender,
            receiver=receiver,
            payload=payload,
            num_candidates=num_candidates,
            max_bytes=max_bytes,
            max_rows=max_rows,
        )
        assert isinstance(payload, np.ndarray)
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise InvalidMessage(f"{kind.name}: step must be an integer, got {step!r}")
        # the receiver gets its own copy; the sender's array stays private
        frozen = np.array(payload, copy=True, order="C")
        frozen.flags.writeable = False
        return cls(kind, sender, receiver, int(step), frozen, _SEAL)
