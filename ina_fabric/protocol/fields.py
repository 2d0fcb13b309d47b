"""The INA wire format, defined once.

Every other view of the header (numpy dtype, scapy layer, Wireshark dissector, Amaranth
``data.StructLayout``) is generated from :data:`HEADER_FIELDS`. No field offset is
written anywhere else.

A datagram is a UDP payload: the 28-byte header below, then ``nelem`` big-endian int32
elements (``nelem * 4`` bytes, nothing more, nothing less).

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
    "field_offsets", "c_layout",
]

#: 2: ``count`` grew to 16 bits (a RESULT of a tree covers up to MAX_JOB_WORKERS workers)
#: and moved to the 16 bits that were reserved; a version-1 peer would read it wrong, so
#: it drops version-2 datagrams (``drop_bad_version``) rather than misread them
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
    OVERFLOW = 0x02    # at least one element saturated to the int32 range
    RETRANSMIT = 0x04  # DATA sent again by a worker, or RESULT re-sent by unicast
    LAST = 0x08        # last packet of a bucket (informational)
    FORWARDED = 0x10   # DATA a switch whose slot pool was full sent on to its parent (the
                       # worker's DATA, unchanged but for this flag; docs/pool.md)


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
    Field("flags", 8, doc="PARTIAL, OVERFLOW, RETRANSMIT, LAST, FORWARDED", flags=Flags),
    Field("exponent", 8, signed=True,
          doc="DATA: proposed block exponent for the chunk sent one window later; "
              "RESULT: max of the proposals"),
    Field("job", 16, doc="job id"),
    Field("worker", 8, doc="member id at the receiving switch (0..31: a worker at its "
                           "leaf, a child switch at its parent); 255 in a group RESULT"),
    Field("reserved", 8, doc="zero"),
    Field("seq", 32, doc="packet sequence number within the job"),
    Field("nelem", 16, doc="number of int32 elements after the header"),
    Field("count", 16, doc="RESULT: number of workers in the sum (the whole tree's); "
                           "DATA from a child switch: workers its partial sum covers; "
                           "0 in a worker's DATA"),
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
             LAST=int(Flags.LAST), FORWARDED=int(Flags.FORWARDED), NO_EXPONENT=NO_EXPONENT, GROUP_WORKER=GROUP_WORKER,
             NONFINITE=NONFINITE_EXPONENT, MAX_JOB_WORKERS=MAX_JOB_WORKERS)
    return d

