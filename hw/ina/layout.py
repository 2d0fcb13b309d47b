"""Amaranth views of the INA wire format and of the core's stream payloads.

:func:`header_layout` is generated from ``ina_fabric.protocol.fields.HEADER_FIELDS``; no offset
is written here. A ``data.StructLayout`` puts its first field at bit 0, while the wire is
big-endian, so the fields are laid out in *reverse* wire order: the 224-bit value of the
layout equals ``int.from_bytes(header_bytes, "big")``.

Words and lanes. The core's streams carry the UDP payload as big-endian 32-bit words,
``L`` words (lanes) per beat; lane 0 is the earliest word on the wire, and a word's bits
31..24 are its first byte. The 7 header words fill the first ``ceil(7/L)`` beats (lanes
past word 6 are padding), and the elements start on a fresh beat. So the header value
is ``Cat(word6, ..., word1, word0)`` (see :func:`header_from_words`).
"""

from amaranth.hdl import Cat, Const, unsigned, signed
from amaranth.lib import data, enum

from ina_fabric.protocol.fields import HEADER_FIELDS, HEADER_BYTES

from .params import HEADER_WORDS

__all__ = ["header_layout", "HeaderLayout", "in_layout", "out_layout",
           "header_from_words", "header_words", "header_int", "Reason", "OpKind", "AccMode",
           "request_layout", "busy_layout"]


def header_layout() -> data.StructLayout:
    """The INA header as a StructLayout whose value is the header read as one big-endian
    integer (first wire field in the top bits)."""
    fields = {}
    for f in reversed(HEADER_FIELDS):
        fields[f.name] = signed(f.bits) if f.signed else unsigned(f.bits)
    layout = data.StructLayout(fields)
    assert layout.size == 8 * HEADER_BYTES == 32 * HEADER_WORDS
    return layout


HeaderLayout = header_layout()


def _beat_fields(lanes: int) -> dict:
    """Fields every packet-stream beat of the core has, in and out."""
    return {"data": data.ArrayLayout(32, lanes), "n": range(lanes + 1), "first": 1,
            "last": 1, "length": 16}


def in_layout(lanes: int) -> data.StructLayout:
    """Payload of the core's input stream (one beat).

    data      ``lanes`` big-endian 32-bit words of the UDP payload
    n         valid words in this beat (1..lanes); lanes >= n are don't-care
    first     first beat of a datagram
    last      last beat of a datagram
    length    UDP payload length in bytes (the datagram the model sees); read on ``first``
    src_ip    IPv4 source address of the datagram; read on ``first``
    src_port  UDP source port of the datagram; read on ``first``
    src_mac   Ethernet source address of the frame; read on ``first`` (the control
              plane answers CONTROL there)
    """
    return data.StructLayout({
        **_beat_fields(lanes),
        "src_ip": 32,
        "src_port": 16,
        "src_mac": 48,
    })


def out_layout(lanes: int) -> data.StructLayout:
    """Payload of the core's output stream (one beat of one RESULT copy).

    data, n, first, last   as :func:`in_layout` (a RESULT is laid out the same way)
    length       UDP payload length in bytes (header + 4 * nelem)
    dst_mac      destination MAC (member MAC, or 01:00:5e + low 23 bits of the group IP)
    dst_ip       destination IPv4 address (member or multicast group)
    dst_port     destination UDP port
    ip_checksum  IPv4 header checksum of the header template in ``hw/ina/replicator.py``
                 (``ipv4_header``): version 4, IHL 5, TOS 0, total length = length + 28,
                 id 0, DF, TTL 64, UDP, source = the core's ``src_ip`` register
    mcast        1 when the copy goes to an IP multicast group
    """
    return data.StructLayout({
        **_beat_fields(lanes),
        "dst_mac": 48,
        "dst_ip": 32,
        "dst_port": 16,
        "ip_checksum": 16,
        "mcast": 1,
    })


def header_from_words(words):
    """A HeaderLayout view of the header's 32-bit words in wire order."""
    assert len(words) == HEADER_WORDS
    return data.View(HeaderLayout, Cat(*reversed(list(words))))


def header_words(value):
    """The wire-order 32-bit words of a header value (a View or a Value)."""
    v = value.as_value() if hasattr(value, "as_value") else value
    return [v[32 * (HEADER_WORDS - 1 - i):32 * (HEADER_WORDS - i)] for i in range(HEADER_WORDS)]


def header_int(header_bytes: bytes) -> int:
    """Python: the integer value of a header for ``HeaderLayout`` (for tests)."""
    return int.from_bytes(header_bytes[:HEADER_BYTES], "big")


class Reason(enum.Enum, shape=4):
    """Why the header pipeline drops a packet before the slot rules (P0's checks; when
    several apply, the lowest-numbered one wins, the reference model's order)."""
    OK = 0
    TRUNCATED = 1
    BAD_VERSION = 2
    CONTROL = 3             # a STATUS_REQ or CONTROL: the control plane counts it
    MALFORMED = 4
    UNKNOWN_JOB = 5
    UNKNOWN_SOURCE = 6      # worker out of the job's range (the member compare is in P1a)
    BIG_NELEM = 7           # more elements than the job allows
    BAD_SESSION = 8         # not the job's session (checked after the job, before the source)
    BAD_COUNT = 9           # a child switch's DATA covers 0 or more than the job's workers


class OpKind(enum.Enum, shape=2):
    """What an operation on a slot record is."""
    SCAN = 0                # the deadline scanner's visit
    PKT = 1                 # a decoded DATA packet
    INIT = 2                # one record of a job's initialization


class AccMode(enum.Enum, shape=2):
    """What the element path does with a packet's elements."""
    NONE = 0                # nothing (dropped, duplicate, ...)
    OPEN = 1                # first contribution: write the elements
    ADD = 2                 # add them to the accumulators


def request_layout(P) -> data.StructLayout:
    """A request to the replicator (:class:`~.replicator.Replicator`), as the request
    queue holds it: the slot record (its accumulators stay where they are) and a snapshot
    of its header fields; ``unicast`` for a re-send to ``worker``; ``partial`` for a
    result with fewer than N contributions (a spine's: fewer than the job's workers).
    ``P`` is the core's ``CoreParams``; with ``tree``, ``count`` holds up to
    MAX_JOB_WORKERS workers and ``ovf`` is a child's OVERFLOW."""
    from .params import TREE_COUNT_BITS
    return data.StructLayout({
        "rec": range(P.records), "job": range(max(2, P.jobs)), "unicast": 1,
        "worker": range(32), "seq": 32,
        "count": TREE_COUNT_BITS if P.tree else range(P.workers + 1),
        "bitmap": P.workers, "exponent": signed(8),
        "nelem": (unsigned(P.elements.bit_length() + 2) if P.narrow  # with narrow widths,
                  else range(P.elements + 1)),           # the key (lanes.nkey)
        "partial": 1, **({"ovf": 1} if P.tree else {}),
        # a leaf (hw/ina/leaf.py): what the request sends (``leaf.ReqKind``: RESULT, UP,
        # REL) and, for a relayed RESULT, the parent's flags
        **({"kind": 2, "pfl": 8} if P.leaf else {}),
    })


def busy_layout(P) -> data.ArrayLayout:
    """The slot records whose accumulators the element path still writes: the packet in
    flight, then its S1, E1 and E2 stages (each a ``valid`` bit and a record)."""
    return data.ArrayLayout(data.StructLayout({"valid": 1, "rec": range(P.records)}), 4)
