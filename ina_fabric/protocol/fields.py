"""The INA wire format, defined once.

Every other view of the header (numpy dtype, scapy layer, Wireshark dissector, Amaranth
``data.StructLayout``) is generated from :data:`HEADER_FIELDS`. No field offset is
written anywhere else.

A datagram is a UDP payload: the 28-byte header below, then ``nelem`` big-endian
elements of the width the ``width`` byte names: int32 (code 0, the default, 4 bytes each),
int16 (code 1, 2 bytes) or int8 (code 2, 1 byte); ``nelem * (4 >> code)`` bytes, nothing
more, nothing less (docs/precision.md). Its low nibble is the width of the elements that
follow (``elem_width``), its high nibble the width of the RESULT the slot returns
(``sum_width``); they differ only in a child switch's DATA to its parent, whose partial
sum goes up wider so that it stays exact (``up_width``). An int32 datagram has ``width``
0: its bytes are those of protocol version 2 before the field existed.

Every DATA and RESULT carries its run's ``session``: a random 64-bit id that the job's
installer draws for each run and installs with the job (``jobtable.JobConfig.session``).
A switch drops DATA whose session is not its job's (``drop_bad_session``), and a worker
takes only RESULTs with its own session, so a packet of a previous run, of another tenant
that reuses the job id, or of an off-path forger who cannot see the traffic, never
reaches a sum. (It is a capability, not a MAC: whoever sees the link sees it. See the
docs/design.md, "Trust model".)
"""

from dataclasses import dataclass, field
import enum

__all__ = [
    "Field", "HEADER_FIELDS", "HEADER_BYTES", "VERSION", "INA_UDP_PORT",
    "MsgType", "Flags", "Refusal", "ERROR_INTERVAL", "ERROR_SOURCES", "error_bucket",
    "NO_EXPONENT", "MAX_WORKERS", "MAX_JOB_WORKERS", "GROUP_WORKER", "NONFINITE_EXPONENT",
    "field_offsets", "c_layout", "WIDTH_CODES", "WIDTH_BITS", "width_byte", "elem_width",
    "sum_width", "up_width", "elem_bytes", "valid_width",
]

#: 2: ``count`` grew to 16 bits (a RESULT of a tree covers up to MAX_JOB_WORKERS workers)
#: and moved to the 16 bits that were reserved; a version-1 peer would read it wrong, so
#: it drops version-2 datagrams (``drop_bad_version``) rather than misread them
#: (issue 40's ``width`` took the byte that was reserved, without a bump: an int32
#: datagram keeps its version-2 bytes, and a version-2 peer that predates it drops a
#: narrow datagram as malformed, since its length is not ``nelem * 4``)
VERSION = 2
INA_UDP_PORT = 19900
#: members of one switch's job: workers of a leaf, or child switches of a spine (one
#: bitmap bit each)
MAX_WORKERS = 32
#: workers of one job across a tree of switches (docs/fabric.md): 32 leaves of 32
MAX_JOB_WORKERS = 1024
#: exponent value meaning "no proposal" (int8 minimum)
NO_EXPONENT = -128
#: the worker field of a RESULT sent to the whole group (a unicast re-send names its worker)
GROUP_WORKER = 255
#: exponent proposal of a chunk that holds inf or NaN: the largest int8, so the switch's
#: max carries it to every worker, and every worker's result for that chunk is NaN (the
#: chunk's data travel as zeros). AMP's GradScaler then sees the overflow on every rank.
NONFINITE_EXPONENT = 127


class MsgType(enum.IntEnum):
    DATA = 1      # worker -> switch: a chunk of one worker's contribution
    RESULT = 2    # switch -> worker(s): the aggregated chunk
    STATUS_REQ = 3  # anyone -> switch: ask for counters
    STATUS = 4    # switch -> asker: counters as UTF-8 JSON in the payload
    CONTROL = 5   # host -> switch/FPGA: a job-table entry in the payload (see jobtable)
    ERROR = 6     # switch -> sender of a DATA it dropped for a reason the sender can fix


class Refusal(enum.IntEnum):
    """Why a switch dropped a DATA, in the ERROR it answers with (the ``count`` field).

    An ERROR is the header alone (28 bytes, never larger than the DATA it answers, so
    the switch is no amplifier): ``job``, ``worker``, ``seq`` and ``session`` are the
    DATA's (a sender takes only an ERROR that names its own DATA), ``count`` is the
    reason, ``bitmap`` a figure that helps fix it, ``nelem`` 0. A switch answers one
    source at most once per ``ERROR_INTERVAL`` (``error_bucket``); the drop is counted
    whether or not it answers."""
    UNKNOWN_JOB = 1     # no job with this id; bitmap: 0
    NOT_MEMBER = 2      # the source is not the job's member ``worker``; bitmap: members
    BAD_LENGTH = 3      # more elements than the job's, or not the slot's; bitmap: the
                        # job's elements per packet
    BAD_SESSION = 4     # the job is held by another session (another run); bitmap: 0
    STALE = 5           # the seq is behind the job (its slot moved on, its result is
                        # gone); bitmap: the job's position (the next seq it opens)
    BAD_WIDTH = 6       # the DATA's element width is not the one its slot opened with
                        # (docs/precision.md); bitmap: the slot's ``width`` byte


#: a switch answers one source (a bucket of ``error_bucket``) at most this often, seconds
ERROR_INTERVAL = 0.1
#: buckets of the per-source rate limit (sources that share a bucket share its budget)
ERROR_SOURCES = 256


def error_bucket(ip: int, port: int) -> int:
    """The rate-limit bucket of a source (``ip`` as a 32-bit int), as every switch
    computes it: a multiplicative hash of ip and port, its top 8 bits."""
    return (((ip ^ (port << 16) ^ port) * 0x9E3779B1) & 0xFFFFFFFF) >> 24


class Flags(enum.IntFlag):
    PARTIAL = 0x01     # RESULT emitted at the deadline with count < N
    OVERFLOW = 0x02    # at least one element saturated to the range of its width (int32,
                       # int16 or int8: the ``width`` byte's); a switch saturates once,
                       # when it emits, never while it sums
    RETRANSMIT = 0x04  # DATA sent again by a worker, or RESULT re-sent by unicast
    LAST = 0x08        # last packet of a bucket (informational)
    FORWARDED = 0x10   # DATA a switch whose slot pool was full sent on to its parent (the
                       # worker's DATA, unchanged but for this flag; docs/pool.md)
    CONGESTED = 0x20   # RESULT sent while 7/8 of the switch's slot pool was held (new
                       # slots soon go to the parent): the client's congestion window
                       # backs off (docs/congestion.md; no qdisc here marks ECN)


#: element width codes (the nibbles of the ``width`` byte): code -> bits. An element of
#: code c is ``4 >> c`` bytes, big-endian, two's complement.
WIDTH_BITS = {0: 32, 1: 16, 2: 8}
#: bits -> code
WIDTH_CODES = {bits: code for code, bits in WIDTH_BITS.items()}


def width_byte(elem: int, result: int | None = None) -> int:
    """The ``width`` byte of a datagram whose elements are ``elem`` bits wide and whose
    slot returns ``result`` bits (default: the same; a worker's DATA and every RESULT)."""
    result = elem if result is None else result
    if elem not in WIDTH_CODES or result not in WIDTH_CODES:
        raise ValueError(f"element width must be one of 32, 16, 8 bits, not {elem}/{result}")
    return WIDTH_CODES[elem] | WIDTH_CODES[result] << 4


def valid_width(b: int) -> bool:
    """Both nibbles of ``width`` byte ``b`` name a width, and the elements are no
    narrower than the result."""
    lo, hi = b & 0xF, b >> 4
    return lo in WIDTH_BITS and hi in WIDTH_BITS and lo <= hi


def elem_width(b: int) -> int:
    """Bits of the elements after the header, from the ``width`` byte."""
    return WIDTH_BITS[b & 0xF]


def sum_width(b: int) -> int:
    """Bits of the RESULT's elements, from the ``width`` byte."""
    return WIDTH_BITS[b >> 4]


def elem_bytes(b: int) -> int:
    """Bytes per element after the header, from the ``width`` byte."""
    return 4 >> (b & 0xF)


def up_width(result_bits: int, total: int) -> int:
    """Bits of the elements a switch sends its parent for a slot whose RESULT is
    ``result_bits`` wide, in a job of ``total`` workers: wide enough that every partial
    sum is exact. int8 goes up as int16 (a sum of at most 255 int8 values fits), int16
    and int8 in a job of more than 255 workers as int32 (1024 x 2^15 fits), int32 as
    int32 (saturated and flagged, as before)."""
    if result_bits == 8 and total <= 255:
        return 16
    return 32


@dataclass(frozen=True)
class Field:
    name: str
    bits: int
    signed: bool = False
    doc: str = ""
    enum: type | None = field(default=None, compare=False)
    flags: type | None = field(default=None, compare=False)

    @property
    def nbytes(self) -> int:
        return self.bits // 8


#: Network byte order, in wire order. Sizes are whole bytes.
HEADER_FIELDS: tuple[Field, ...] = (
    Field("version", 8, doc="protocol version, 1"),
    Field("type", 8, doc="message type", enum=MsgType),
    Field("flags", 8, doc="PARTIAL, OVERFLOW, RETRANSMIT, LAST, FORWARDED, CONGESTED", flags=Flags),
    Field("exponent", 8, signed=True,
          doc="DATA: proposed block exponent for the chunk sent one window later; "
              "RESULT: max of the proposals"),
    Field("job", 16, doc="job id"),
    Field("worker", 8, doc="member id at the receiving switch (0..31: a worker at its "
                           "leaf, a child switch at its parent); 255 in a group RESULT"),
    Field("width", 8, doc="element widths: low nibble, the elements after the header; "
                          "high nibble, the RESULT's; 0 int32, 1 int16, 2 int8"),
    Field("seq", 32, doc="packet sequence number within the job"),
    Field("nelem", 16, doc="number of elements after the header (of the width byte's "
                           "low nibble)"),
    Field("count", 16, doc="RESULT: number of workers in the sum (the whole tree's); "
                           "DATA from a child switch: workers its partial sum covers; "
                           "a worker's DATA: 0, or its ack d (it has the RESULT of "
                           "every seq up to seq - d: a switch with a slot pool frees "
                           "those, docs/pool.md)"),
    Field("bitmap", 32, doc="contributor bitmap of one level, bit m = member m: in a "
                            "RESULT, of the workers of the receiving worker's leaf"),
    Field("session", 64, doc="the run's session id (random, drawn at install); "
                             "0 outside DATA and RESULT"),
)

HEADER_BYTES = sum(f.nbytes for f in HEADER_FIELDS)
assert HEADER_BYTES == 28


def field_offsets() -> dict[str, int]:
    """Byte offset of each field from the start of the header."""
    out, off = {}, 0
    for f in HEADER_FIELDS:
        out[f.name] = off
        off += f.nbytes
    return out


def c_layout() -> dict:
    """The wire format as the compiled data paths take it (``ina_wire.h``): each field's
    offset (``name``) and width in bytes (``name_bytes``), the header length and the
    constants they use."""
    d = dict(field_offsets())
    d.update({f"{f.name}_bytes": f.nbytes for f in HEADER_FIELDS})
    d.update(header=HEADER_BYTES, VERSION=VERSION, DATA=int(MsgType.DATA),
             RESULT=int(MsgType.RESULT), ERROR=int(MsgType.ERROR), PARTIAL=int(Flags.PARTIAL),
             OVERFLOW=int(Flags.OVERFLOW), RETRANSMIT=int(Flags.RETRANSMIT),
             LAST=int(Flags.LAST), FORWARDED=int(Flags.FORWARDED),
             CONGESTED=int(Flags.CONGESTED), NO_EXPONENT=NO_EXPONENT, GROUP_WORKER=GROUP_WORKER,
             NONFINITE=NONFINITE_EXPONENT, MAX_JOB_WORKERS=MAX_JOB_WORKERS,
             BAD_WIDTH=int(Refusal.BAD_WIDTH))
    return d

