"""What the header pipeline's stages share: the slot record's metadata, an operation's
registers, the compares behind the slot rules (each with a Python twin, the model's
definition, so tests/test_hw_ina_blocks.py can prove them for every input), and the
counter events the pipeline raises."""

from amaranth.hdl import *
from amaranth.lib import data

from .layout import Reason, OpKind
from .params import CoreParams

__all__ = ["DEC_LAT", "HEADER_EVENTS", "CHECK_REASONS", "meta_layout", "op_layout",
           "CMP_FIELDS", "RULE_FIELDS", "record_of", "record_of_py", "seq_at_or_behind",
           "seq_at_or_behind_py", "due_reached", "due_reached_py", "below", "eq_chain",
           "md_compares", "log2", "stage_layout", "write_layout"]

DEC_LAT = 4   # pop of a packet's last header beat (cycle t) -> its P2 decision (t + 4)

#: the counter events the header pipeline raises (events per cycle): all but the
#: replicator's ``overflows``, the element path's ``stream_errors`` and the control
#: plane's (STATUS_REQ and CONTROL)
HEADER_EVENTS = {
    "rx": 1, "rx_data": 1, "accepted": 1, "duplicates": 2, "late": 1, "results": 2,
    "partials": 2, "resent": 1, "drop_truncated": 1, "drop_malformed": 3,
    "drop_bad_version": 1, "drop_unknown_job": 1, "drop_unknown_source": 1,
    "drop_bad_session": 1, "drop_stale": 1, "drop_out_of_window": 1,
}

#: P0's checks, in the model's priority order (the reason each one gives)
CHECK_REASONS = (Reason.TRUNCATED, Reason.BAD_VERSION, Reason.CONTROL, Reason.MALFORMED,
                 Reason.TRUNCATED, Reason.MALFORMED, Reason.UNKNOWN_JOB, Reason.BAD_SESSION,
                 Reason.UNKNOWN_SOURCE, Reason.BIG_NELEM, Reason.BAD_COUNT, Reason.BAD_COUNT)
# (the last: the width byte's nibbles differ: malformed once the source is the member's,
# not answered, as a child's bad count; lanes.width_checks)

#: P1a's registered compares (P1b applies the rules from them)
CMP_FIELDS = ("late", "complete", "eq_seqm", "eq_seq", "lt", "cnt1_n", "one_n", "cnt0",
              "cnt_lt_n", "nelem_ne", "nelem_nz", "src_ok", "pend", "enable", "bounded", "ok",
              "pkt", "may_expire", "width_ne")

#: P1b's registered rules (P2 combines them)
RULE_FIELDS = ("defer", "expire", "reuse", "join", "cur_complete", "dup", "nelem_ne",
               "one_n", "cnt1_n", "opens", "new_exp", "stale", "oow", "unksrc", "bignelem",
               "pkt", "scan", "init", "pkt_ok", "cnt_lt_n",
               # a spine (CoreParams.tree; 0 otherwise): a child's DATA with a bad count;
               # the record's workers below the job's (before and after this DATA), and
               # this DATA's alone (it opens the record)
               "badcount", "wc_lt_t", "wc1_lt_t", "cov_lt_t",
               # with narrow widths (0 otherwise): a DATA at another width than its record's
               "width_ne",
               # a leaf (CoreParams.leaf; 0 otherwise, :mod:`.leaf`): the job has a parent;
               # the record is up; the op is a RESULT from the parent to relay, or one to
               # drop (not from the parent, another session, no up record awaits it,
               # malformed: elements or count)
               "haspar", "up", "relay", "res_unksrc", "res_badsess", "res_drop",
               "res_malf")


def log2(n):
    return (n - 1).bit_length()


SEQ_MASK = 0xFFFFFFFF


def record_of(seq_low, wbit, lwm):
    """Amaranth: a seq's record within its job, ``Cat(index, set)`` (``lwm + 1`` bits),
    from the low ``lwm + 1`` bits of seq and the job's W as ``wbit`` (``1 << log2 W``,
    W <= 2^lwm, the core's window): index ``seq % W``, set ``(seq // W) % 2``."""
    wset = (seq_low & wbit[:lwm + 1]).any()
    widx = (seq_low & (wbit - 1)[:lwm + 1])[:max(1, lwm)]
    return Cat(widx[:lwm], wset)


def record_of_py(seq, window, window_max):
    """The model's record of ``seq`` (set, index) as the core numbers it in a job."""
    return ((seq // window) % 2) * window_max + seq % window


def seq_at_or_behind(tag, seq):
    """Amaranth: seq is the record's tag or before it in 32-bit serial-number arithmetic,
    ``(tag - seq) mod 2^32 < 2^31`` (the sign of a 32-bit subtraction: one carry chain).
    The slot rules join ``seq == tag`` first, so what is left of it is the model's
    stale drop (``(tag - seq) mod 2^32`` in 1 .. 2^31 - 1); the rest is out of window."""
    return ~(tag[:32] - seq[:32])[31]


def seq_at_or_behind_py(tag, seq):
    return ((tag - seq) & SEQ_MASK) < 1 << 31


def due_reached(ts, due):
    """Amaranth: a record due at ``due`` has expired at time ``ts`` (``due <= ts``,
    modulo 2^32, so the cycle counter may wrap; deadlines stay below 2^31 cycles)."""
    return ~(ts - due)[31]


def due_reached_py(ts, due):
    return ((ts - due) & SEQ_MASK) < 1 << 31


def meta_layout(P: CoreParams) -> data.StructLayout:
    """The metadata of one slot record: its tag (the seq it holds, 34-bit signed),
    whether it is complete, the bitmap and count of the workers that joined, the larger
    exponent, when it is due (opened + deadline) and its element count. With ``tree``
    (a spine): ``wcount``, the workers the record's sum covers (a child switch's DATA
    covers its ``count``; ``count`` stays the members, for completeness), and ``ovf``, a
    child's DATA had OVERFLOW."""
    from .params import TREE_COUNT_BITS
    return data.StructLayout({
        "tag": signed(34), "complete": 1, "bitmap": P.workers,
        "count": range(P.workers + 1), "exponent": signed(8), "due": 32,
        "nelem": nelem_shape(P),
        **({"wcount": TREE_COUNT_BITS, "ovf": 1} if P.tree else {}),
        # a leaf (``leaf``, :mod:`.leaf`): ``up``, closed here and its sum sent to the
        # parent, whose RESULT it awaits (neither expiring nor reusable); ``rel``, it holds
        # the parent's relayed RESULT (then ``wcount`` and ``exponent`` are the parent's,
        # its elements in the accumulators), ``mine`` the parent's bitmap had this
        # switch's bit, ``pfl`` the parent's flags (RETRANSMIT cleared)
        **({"up": 1, "rel": 1, "mine": 1, "pfl": 8} if P.leaf else {}),
    })


def nelem_shape(P: CoreParams):
    """A record's element count (with narrow widths, its key: ``lanes.nkey``, the width
    code in the low two bits)."""
    return unsigned(P.elements.bit_length() + 2) if P.narrow else range(P.elements + 1)


def op_layout(P: CoreParams) -> data.StructLayout:
    """An operation's registers in a stage: a packet, a scan visit or an initialization
    write, its record, and what the later stages need of its header."""
    return data.StructLayout({
        "kind": OpKind, "checks": len(CHECK_REASONS), "reason": Reason, "rec": range(P.records),
        "seq": 32, "seqm": signed(34), "ts": 32, "worker": 8, "exp": signed(8), "nelem": 18 if P.narrow else 16,
        "base": range(P.records * P.elem_beats + 1), "nbeats": 16, "rewind": 5, "src_ok": 1,
        # a spine (``tree``): the header's count and OVERFLOW flag (used for a job whose
        # members are child switches)
        **({"covers": 16, "ovf": 1} if P.tree else {}),
        # a leaf: the packet is a parent's RESULT (``res``), with the job's session, the
        # parent's bitmap bit for this switch, its flags (RETRANSMIT cleared)
        **({"res": 1, "sess_ok": 1, "mine": 1, "pfl": 8} if P.leaf else {}),
    })


def below(a, b):
    """a < b as the sign of an explicit subtraction: a carry chain straight from the
    operands (synthesis keeps a subtraction a chain; a compare it may turn into LUTs)."""
    a = Cat(a, C(0, 1)).as_signed() if not a.shape().signed else a
    b = Cat(b, C(0, 1)).as_signed() if not b.shape().signed else b
    d = a - b
    return d[len(d) - 1]


def eq_chain(a, b):
    """a == b for wide values as two magnitude compares: two carry chains side by
    side (a tree of LUTs would be four levels deep or more)."""
    return ~below(a, b) & ~below(b, a)


def md_compares(mdx, op, n, nm1, bit, narrow=False):
    """Every compare of an operation against its record's metadata. ``narrow``: the
    ``nelem`` fields are keys (``lanes.nkey``): ``nelem_ne`` compares the element counts
    and ``width_ne`` the widths (the model's ``drop_bad_width``)."""
    # sequence numbers compare modulo 2^32 (the model's serial-number arithmetic):
    # only the tag's low 32 bits count (the initial tags are negative)
    return {"late": due_reached(op.ts, mdx.due), "complete": mdx.complete,
            "eq_seqm": eq_chain(mdx.tag[:32], op.seqm[:32]),
            "eq_seq": eq_chain(mdx.tag[:32], op.seq),
            "lt": seq_at_or_behind(mdx.tag, op.seq), "cnt1_n": mdx.count == nm1,
            "cnt0": mdx.count == 0, "cnt_lt_n": mdx.count < n,
            "nelem_ne": (~eq_chain(op.nelem[2:], mdx.nelem[2:]) if narrow
                         else ~eq_chain(op.nelem, mdx.nelem)),
            "width_ne": op.nelem[:2] != mdx.nelem[:2] if narrow else C(0, 1)}


def stage_layout(P: CoreParams) -> data.StructLayout:
    """An operation in a stage: valid, its registers, whether it is a re-run (``reinj``)
    and whether it followed an operation on its record too closely (``adj``: it will be
    re-run)."""
    return data.StructLayout({"valid": 1, "op": op_layout(P), "reinj": 1, "adj": 1})


def write_layout(P: CoreParams) -> data.StructLayout:
    """P3's metadata write (registered in P2, landing at the end of P3)."""
    return data.StructLayout({"en": 1, "addr": range(P.records), "data": meta_layout(P)})
