"""SecAgg+'s masks: AES-128 counter-mode keystreams added to the clients' rows in place.

One keystream per seed (:func:`aes_prg`) covers a whole :class:`~fedrec.federation.secagg.inputs.WordRows`
row and is added to it segment by segment (modulo 2^64 or 2^32) with whole-array NumPy
operations (:class:`Masker`), so MF-SecAvg's 32-bit item words halve the mask bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from fedrec.federation.secagg.inputs import WordRows
from fedrec.federation.secagg.keys import KEY_BYTES

#: The nonce of every AES-GCM use of SecAgg+ (keystreams, sealed pair keys): a key only ever
#: encrypts one plaintext.
NONCE = bytes(12)
_WORD_BYTES = 8
#: A segment of at least this many bytes is masked stream by stream (a smaller one is collected
#: and masked in one ``ufunc.at`` per segment, which is slow per word but cheap per call).
_LARGE_SEGMENT_BYTES = 4096


_ZEROS: dict[int, bytes] = {}


def aes_prg(key: bytes, length: int) -> np.ndarray:
    """``length`` pseudorandom uint64 words: the AES-128 counter-mode keystream under ``key``
    (read-only). Computed as the AES-GCM encryption of zeros, whose ciphertext is exactly that
    keystream (the tag is dropped), because OpenSSL's GCM path is the fastest AES code here."""
    if len(key) != KEY_BYTES:
        raise ValueError("AES PRG keys are 16 bytes")
    stream = AESGCM(key).encrypt(NONCE, _zeros(_WORD_BYTES * length), None)
    return np.frombuffer(stream, dtype="<u8", count=length)


def _zeros(size: int) -> bytes:
    """``size`` zero bytes (cached: the plaintext every keystream encrypts)."""
    zeros = _ZEROS.get(size)
    if zeros is None:
        if len(_ZEROS) > 8:
            _ZEROS.clear()
        zeros = _ZEROS[size] = bytes(size)
    return zeros


class Masker:
    """Adds AES keystreams of whole rows to the rows of a :class:`WordRows` in place.

    ``targets[s]`` is a (targets, words) array for segment s: the rows of the clients, or the
    server's running total as one row. The large segments (the largest, and any of at least
    :data:`_LARGE_SEGMENT_BYTES`: MF-SecAvg's item part, and a companion's) are added stream by
    stream with one NumPy operation each; the other (small) segments, MF-SecAvg's 14 network
    words, are collected and added in one operation per segment at :meth:`finish`, which must be
    called before reading the targets.
    """

    def __init__(self, rows: WordRows, targets: Sequence[np.ndarray]) -> None:
        offsets = rows.offsets
        sizes = [dtype.itemsize * count for dtype, _, count in offsets]
        largest = max(range(len(sizes)), key=sizes.__getitem__) if sizes else None
        self.mains = [
            s for s in range(len(sizes)) if s == largest or sizes[s] >= _LARGE_SEGMENT_BYTES
        ]
        self.minor = [s for s in range(len(sizes)) if s not in self.mains and sizes[s]]
        self.offsets = offsets
        self.zeros = _zeros(rows.buffer.shape[1])
        self.targets_by_segment = targets
        self.main_targets = [list(targets[s]) for s in self.mains]
        self.heads: list[bytes] = []
        self.plus: list[tuple[int, int]] = []  # (target, stream)
        self.minus: list[tuple[int, int]] = []
        self.streams = 0

    def expand(self, key: bytes) -> tuple[list[np.ndarray], int]:
        """The large segments' words of ``key``'s keystream, and the stream's number."""
        stream = AESGCM(key).encrypt(NONCE, self.zeros, None)
        for s in self.minor:
            dtype, offset, count = self.offsets[s]
            self.heads.append(stream[offset : offset + dtype.itemsize * count])
        self.streams += 1
        words = []
        for s in self.mains:
            dtype, offset, count = self.offsets[s]
            words.append(np.frombuffer(stream, dtype, count, offset))
        return words, self.streams - 1

    def add(self, target: int, stream: tuple[list[np.ndarray], int]) -> None:
        for rows, words in zip(self.main_targets, stream[0], strict=True):
            row = rows[target]
            np.add(row, words, out=row)
        self.plus.append((target, stream[1]))

    def subtract(self, target: int, stream: tuple[list[np.ndarray], int]) -> None:
        for rows, words in zip(self.main_targets, stream[0], strict=True):
            row = rows[target]
            np.subtract(row, words, out=row)
        self.minus.append((target, stream[1]))

    def finish(self) -> None:
        for position, s in enumerate(self.minor):
            dtype, _, count = self.offsets[s]
            chunks = self.heads[position :: len(self.minor)]
            heads = np.frombuffer(b"".join(chunks), dtype).reshape(len(chunks), count)
            segment = self.targets_by_segment[s]
            for pairs, ufunc in ((self.plus, np.add), (self.minus, np.subtract)):
                if pairs:
                    where, which = np.array(pairs, dtype=np.int64).T
                    ufunc.at(segment, where, heads[which])
        self.heads, self.plus, self.minus = [], [], []
