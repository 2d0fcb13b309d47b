"""Authenticated control, defined once: who may install jobs and read a switch's state.

CONTROL and STATUS_REQ datagrams, and the STATUS replies to them, end in a 24-byte
trailer: an 8-byte nonce (big-endian; senders use the wall clock in nanoseconds) and a
16-byte tag, the first half of HMAC-SHA256 under the switch's key over everything
before the tag. A reply carries the nonce of the request it answers, so a client takes
no reply that was not made for it. The switch takes a nonce once (:class:`ReplayGuard`):
it remembers the :data:`REPLAY_SLOTS` highest nonces it has taken, and takes a nonce that
is not among them and, once it remembers that many, is above the lowest of them. A
replay is therefore refused whatever its age, with a store of fixed size that the
gateware keeps in registers (the software switch, its model and the RTL follow this one
rule). A sender whose clock lags the others' by more than their last
:data:`REPLAY_SLOTS` requests is refused too, and retries with a fresh nonce. DATA and
RESULT datagrams are not covered here (they are checked by source address; see the
docs/design.md, "Trust model").

A CONTROL datagram whose length cannot hold one job-table entry and the trailer (see
:func:`control_length_ok`) is malformed before its tag is looked at: the gateware hashes
only what fits its buffer, and every switch checks the same.

The key is 32 random bytes, shared by the switch and whoever configures it (the host
side finds it through ``INA_SWITCH_KEY`` / ``INA_SWITCH_KEY_FILE``; see
``ina_fabric.protocol.keys``). HMAC-SHA256 is in the Python standard library; a
gateware control path would take the same bytes (issue: in-band control).
"""

import hashlib
import hmac
import time

from .fields import HEADER_BYTES, MAX_WORKERS
from .jobtable import ENTRY_DTYPE, MEMBER_DTYPE

__all__ = ["NONCE_BYTES", "TAG_BYTES", "TRAILER_BYTES", "REPLAY_SLOTS", "seal",
           "unseal", "ReplayGuard", "new_nonce", "MAX_CONTROL_BYTES", "control_length_ok",
           "STATUS_MIN_REQUEST", "STATUS_MAX_REQUEST", "status_length_ok"]

NONCE_BYTES = 8
TAG_BYTES = 16
TRAILER_BYTES = NONCE_BYTES + TAG_BYTES
#: a STATUS_REQ is padded to at least this many bytes, and a STATUS reply is never
#: larger than the request that asked for it: a switch is no reflection amplifier
STATUS_MIN_REQUEST = 1200
#: ... and at most this many (what the gateware buffers while it checks the tag)
STATUS_MAX_REQUEST = 2048


def status_length_ok(n: int) -> bool:
    """Whether a STATUS_REQ of ``n`` bytes (trailer included) is answered at all: 1,200
    to 2,048 bytes, whole 32-bit words (a switch counts any other as
    ``status_unpadded`` and does not look further)."""
    return STATUS_MIN_REQUEST <= n <= STATUS_MAX_REQUEST and n % 4 == 0
#: how many of the highest nonces taken a switch remembers (the gateware's registers)
REPLAY_SLOTS = 8
#: the INA header, a job-table entry with 32 members, and the trailer
_ENTRY, _MEMBER = ENTRY_DTYPE.itemsize, MEMBER_DTYPE.itemsize
_MAX_MEMBERS = MAX_WORKERS
MIN_CONTROL_BYTES = HEADER_BYTES + _ENTRY + TRAILER_BYTES
MAX_CONTROL_BYTES = MIN_CONTROL_BYTES + _MAX_MEMBERS * _MEMBER


def control_length_ok(n: int) -> bool:
    """Whether a CONTROL datagram of ``n`` bytes (trailer included) can be a sealed
    job-table entry (``jobtable.ENTRY_DTYPE`` and 0..32 members of ``MEMBER_DTYPE``)."""
    return MIN_CONTROL_BYTES <= n <= MAX_CONTROL_BYTES and \
        (n - MIN_CONTROL_BYTES) % _MEMBER == 0


def new_nonce() -> int:
    return time.time_ns()


def _tag(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).digest()[:TAG_BYTES]


def seal(datagram: bytes, key: bytes, nonce: int) -> bytes:
    """``datagram`` with the nonce and tag appended."""
    body = bytes(datagram) + int(nonce).to_bytes(NONCE_BYTES, "big")
    return body + _tag(key, body)


def unseal(datagram: bytes, key: bytes):
    """``(datagram without its trailer, nonce)``, or None when the tag does not verify
    (or there is no trailer)."""
    if key is None or len(datagram) < TRAILER_BYTES:
        return None
    body, tag = bytes(datagram[:-TAG_BYTES]), bytes(datagram[-TAG_BYTES:])
    if not hmac.compare_digest(_tag(key, body), tag):
        return None
    return body[:-NONCE_BYTES], int.from_bytes(body[-NONCE_BYTES:], "big")


class ReplayGuard:
    """Takes each nonce once: remembers the ``slots`` highest nonces taken; a nonce is
    taken when it is not among them and, once ``slots`` are remembered, above the lowest
    (which it then replaces). Every nonce ever taken is either remembered or at most the
    lowest remembered one, so no nonce is taken twice."""

    def __init__(self, slots: int = REPLAY_SLOTS):
        self.slots = slots
        self.kept = []

    def take(self, nonce: int) -> bool:
        if nonce in self.kept:
            return False
        if len(self.kept) >= self.slots:
            low = min(self.kept)
            if nonce <= low:
                return False
            self.kept.remove(low)
        self.kept.append(nonce)
        return True
