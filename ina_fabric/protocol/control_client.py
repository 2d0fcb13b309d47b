"""The control-plane client, beside the rule it follows (``auth``): install or remove a job
on a running switch (CONTROL) and read its counters and jobs (STATUS_REQ, paged), each
request sealed with the switch's key and answered by a STATUS reply carrying our nonce.

Any switch answers it the same way: the software switch (``ina switch``), the RTL engine
and the board. The runtime (transport, hook, lab) imports this module, never the server.
"""

import json
import socket

import numpy as np

from .auth import seal, unseal, new_nonce, TRAILER_BYTES, STATUS_MIN_REQUEST, \
    STATUS_MAX_REQUEST
from .fields import HEADER_BYTES, VERSION, MsgType
from .keys import switch_key
from .numpy_view import HEADER_DTYPE

__all__ = ["query_status", "send_job", "remove_job", "JobRefused", "status_request_bytes"]


def _request(addr, datagram, timeout, key):
    """Seal ``datagram``, send it, and return the JSON of the STATUS reply that answers
    it (same nonce, our key); other datagrams are ignored until ``timeout``."""
    if key is None:
        # the same default as a switch starting here: whichever comes first creates it
        key = switch_key(create=True)
    nonce = new_nonce()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(timeout)
    try:
        s.sendto(seal(datagram, key, nonce), addr)
        while True:
            data, src = s.recvfrom(65536)
            opened = unseal(data, key)
            if opened is None or opened[1] != nonce or len(opened[0]) < HEADER_BYTES:
                continue       # not an answer to this request: keep waiting
            body = opened[0]
            if np.frombuffer(body, HEADER_DTYPE, count=1)[0]["type"] != MsgType.STATUS:
                raise ValueError("unexpected reply type")
            return json.loads(body[HEADER_BYTES:])
    finally:
        s.close()


def _header(mtype) -> bytes:
    h = np.zeros((), HEADER_DTYPE)
    h["version"], h["type"] = VERSION, mtype
    return h.tobytes()


class JobRefused(ValueError):
    """The switch refused a CONTROL entry; the message is its reason."""


def query_status(addr, timeout=1.0, key=None, max_pages=10_000) -> dict:
    """Counters and jobs of a running switch, as a dict: every page of its paged STATUS
    (each request padded to the size its reply may have). ``key``: the control key
    (default: ``keys.switch_key()``)."""
    start, jobs, doc = 0, {}, {}
    # the largest request a switch answers that goes in one IP packet on the route: the
    # most jobs (with their counters) a page; a larger one is sent in IP fragments, which
    # a board (the FPGA's front end, and the board engine's) drops (drop_ip_fragment)
    pad = _request_bytes(addr) - HEADER_BYTES - 4 - TRAILER_BYTES
    for _ in range(max_pages):
        doc = _request(addr, _header(MsgType.STATUS_REQ) + bytes(pad) +
                       start.to_bytes(4, "big"), timeout, key)
        jobs.update(doc.get("jobs", {}))
        if doc.get("next_job") is None:
            break
        start = int(doc["next_job"])
    out = {"counters": doc.get("counters", {}), "jobs": jobs}
    if "rtl" in doc:     # the RTL engine's figures (cycles, cycles per packet, ...)
        out["rtl"] = doc["rtl"]
    if "pool" in doc:    # the shared slot pool (docs/pool.md)
        out["pool"] = doc["pool"]
    return out


#: Linux's IP_MTU (socket.IP_MTU where Python has it): a connected socket's route MTU
_IP_MTU = getattr(socket, "IP_MTU", 14)


def status_request_bytes(mtu: int) -> int:
    """The size of a STATUS_REQ (trailer included) on a route of ``mtu`` bytes: the
    largest in one IPv4 packet (``mtu`` less the 20-byte IPv4 and 8-byte UDP headers,
    whole 32-bit words), within what a switch answers (``auth.status_length_ok``)."""
    return max(STATUS_MIN_REQUEST, min(STATUS_MAX_REQUEST, (mtu - 28) // 4 * 4))


def _request_bytes(addr) -> int:
    """``status_request_bytes`` of the route to ``addr`` (the kernel's route MTU);
    STATUS_MAX_REQUEST where the kernel does not say."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(tuple(addr))
        return status_request_bytes(s.getsockopt(socket.IPPROTO_IP, _IP_MTU))
    except OSError:
        return STATUS_MAX_REQUEST
    finally:
        s.close()


def send_job(addr, cfg, timeout=1.0, update=False, key=None) -> dict:
    """Install a job (``JobConfig``) on a running switch with a CONTROL datagram; its
    slots start afresh. ``update=True``: a live update (only the deadline may change;
    the slots are kept). Raises JobRefused with the switch's reason."""
    reply = _request(addr, _header(MsgType.CONTROL) + cfg.to_bytes(update=update), timeout,
                     key)
    if "error" in reply:
        raise JobRefused(reply["error"])
    return reply


def remove_job(addr, job: int, session: int = 0, timeout=1.0, key=None) -> dict:
    """Remove job ``job`` from a running switch (only while it holds ``session``, when
    given: a run removes its own job, never a successor's). Raises JobRefused."""
    from .jobtable import removal_entry
    reply = _request(addr, _header(MsgType.CONTROL) + removal_entry(job, session), timeout,
                     key)
    if "error" in reply:
        raise JobRefused(reply["error"])
    return reply
