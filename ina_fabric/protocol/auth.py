"""Authenticated control, defined once: who may install jobs and read a switch's state.

CONTROL and STATUS_REQ datagrams, and the STATUS replies to them, end in a 24-byte
trailer: an 8-byte nonce (big-endian; senders use the wall clock in nanoseconds) and a
16-byte tag, the first half of HMAC-SHA256 under the switch's key over everything
before the tag. A reply carries the nonce of the request it answers, so a client takes
no reply that was not made for it. The switch takes a nonce once: a replay, or a nonce
more than :data:`REPLAY_WINDOW_NS` below the highest it has taken, is refused. DATA and
RESULT datagrams are not covered here (they are checked by source address; see the
README's trust model).

The key is 32 random bytes, shared by the switch and whoever configures it (the host
side finds it through ``INA_SWITCH_KEY`` / ``INA_SWITCH_KEY_FILE``; see
``ina_fabric.host.switch.keys``). HMAC-SHA256 is in the Python standard library; a
gateware control path would take the same bytes (issue: in-band control).
"""

import hashlib
import hmac
import time

__all__ = ["NONCE_BYTES", "TAG_BYTES", "TRAILER_BYTES", "REPLAY_WINDOW_NS", "seal",
           "unseal", "ReplayGuard", "new_nonce"]

NONCE_BYTES = 8
TAG_BYTES = 16
TRAILER_BYTES = NONCE_BYTES + TAG_BYTES
#: how far below the highest nonce taken a new one may be (senders' clocks may differ)
REPLAY_WINDOW_NS = 60 * 10 ** 9


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
    """Takes each nonce once, within a sliding window below the highest taken."""

    def __init__(self, window_ns: int = REPLAY_WINDOW_NS):
        self.window = window_ns
        self.high = 0
        self.seen = set()

    def take(self, nonce: int) -> bool:
        if nonce in self.seen or nonce <= self.high - self.window:
            return False
        self.seen.add(nonce)
        if nonce > self.high:
            self.high = nonce
            floor = nonce - self.window
            if len(self.seen) > 4096:
                self.seen = {n for n in self.seen if n > floor}
        return True
