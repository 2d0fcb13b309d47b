"""Parameters of the INA aggregator+replicator core, in plain Python (no Amaranth import).

The WAN schedule optimizer imports :class:`CoreParams` for its FPGA-memory default
(``CoreParams().slot_memory_bytes``).
"""

from dataclasses import dataclass
import math

__all__ = ["CoreParams", "HEADER_WORDS", "QUEUE_SLACK", "TREE_COUNT_BITS", "LEAF_META_BITS"]

from ina_fabric.protocol.fields import HEADER_BYTES, MAX_JOB_WORKERS

#: a spine's worker count (``CoreParams.tree``): up to MAX_JOB_WORKERS workers
TREE_COUNT_BITS = MAX_JOB_WORKERS.bit_length()

#: a leaf's per-record state (``CoreParams.leaf``): up, rel, the parent's bitmap bit for
#: this switch, the parent's flags byte
LEAF_META_BITS = 1 + 1 + 1 + 8

#: the INA header in 32-bit words (28 bytes = 7 words; ina_fabric/protocol/fields.py)
HEADER_WORDS = HEADER_BYTES // 4
assert HEADER_WORDS * 4 == HEADER_BYTES
#: operations (each up to two requests) the core's pipeline can still add after the
#: request queue says stop: the beat being popped, P0, P1a, P1b, P2, P3, and the one
#: popped while the registered stop catches up
QUEUE_SLACK = 7


def _clog2(n: int) -> int:
    return max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class CoreParams:
    """Size of one aggregator+replicator core.

    workers   most workers in one job (1..32); sets the accumulator width
    window    most slots per set of one job (W, a power of two); a job has 2W records
    elements  most int32 elements per packet (E)
    lanes     32-bit elements per clock cycle (L)
    jobs      number of job-table entries, each with its own range of 2W slot records
    queue     depth of the output request queue, in operations (each holds the up to two
              results one operation produces for the replicator)
    widths    element widths the core sums, in bits: (32,) (int32 only), or with 8 and/or
              16, packed 4 x 8 / 2 x 16 per 32-bit lane word (hw/ina/lanes.py; wider
              accumulators and a result memory: a board that cannot afford them leaves
              them out)
    tree      the core can be a spine of a tree of switches (docs/fabric.md): a job whose
              members are child switches (``JobConfig.children``) takes their DATA's
              ``count`` (the workers each covers) and OVERFLOW, and its RESULT carries
              the workers in the sum and PARTIAL below the job's total (per record: an
              11-bit worker count and an overflow bit more). Off: such a job is refused
              (``config_writes``)
    leaf      the core can also be a leaf (or an inner switch) of a tree (docs/fabric.md;
              needs ``tree``): a job whose ``parent`` register is 1 sends, when a slot
              closes, one DATA up to the parent (the ``parent_*`` registers) instead of
              its RESULT, answers a member's re-send at such a slot with that DATA again,
              and relays the parent's RESULT to its members, storing it for their
              re-sends (per record an ``up`` and a ``rel`` bit, the parent's flags and
              its bitmap bit more; ``hw/ina/leaf.py``). Off: such a job is refused
              (``config_writes``)
    answers   the core answers DATA it refuses for a reason the sender can fix with one
              small ERROR, rate-limited per source (``hw/ina/answer.py``, the model's
              ``answers``). Off: refused DATA is dropped and counted only (the model with
              ``answers=False``); a board whose core clock cannot afford the answer path
              leaves it off (constraints/<board>.toml [core])
    """
    workers: int = 32
    window: int = 8
    elements: int = 64
    lanes: int = 1
    jobs: int = 2
    queue: int = 16
    widths: tuple = (32,)
    tree: bool = False
    leaf: bool = False
    answers: bool = True

    def __post_init__(self):
        if not 1 <= self.workers <= 32:
            raise ValueError(f"workers {self.workers} not in 1..32")
        if self.window < 1 or self.window & (self.window - 1):
            raise ValueError(f"window {self.window} must be a power of two")
        if not 1 <= self.elements <= 16384:
            raise ValueError(f"elements {self.elements} not in 1..16384")
        if self.lanes not in (1, 2, 4, 8, 16):
            raise ValueError(f"lanes {self.lanes} not in (1, 2, 4, 8, 16)")
        if self.jobs < 2:
            raise ValueError(f"jobs {self.jobs} must be >= 2")
        if 32 not in self.widths or not set(self.widths) <= {8, 16, 32}:
            raise ValueError(f"widths {self.widths} must be a subset of (8, 16, 32) with 32")
        object.__setattr__(self, "widths", tuple(sorted(set(self.widths))))
        if self.leaf and not self.tree:
            raise ValueError("leaf=True needs tree=True (a leaf's records keep the workers "
                             "they cover and the parent's count)")
        if self.tree and self.narrow:
            raise ValueError("a spine (tree=True) with narrow widths is not built: its "
                             "children's DATA come up wider than the result (fields.up_width)")
        if self.queue <= QUEUE_SLACK or self.queue & (self.queue - 1):
            raise ValueError(f"queue {self.queue} must be a power of two > {QUEUE_SLACK} "
                             f"(the pipeline can add {QUEUE_SLACK} operations after the "
                             "queue says stop)")

    # -- derived sizes -------------------------------------------------------------------
    @property
    def acc_bits(self) -> int:
        """Accumulator width: exact sum of ``workers`` int32 (37 bits for 32 workers)."""
        return 32 + _clog2(self.workers)

    @property
    def narrow(self) -> bool:
        """The core takes int8 and/or int16 elements besides int32."""
        return self.widths != (32,)

    @property
    def acc_word_bits(self) -> int:
        """Bits of one lane's accumulator word (:class:`~.lanes.LaneFormat`): ``acc_bits``
        for int32 only; with narrow widths, segments and gap bits (55 for 32 workers and
        int8), plus the 32-bit saturated result word the element path keeps beside it."""
        if not self.narrow:
            return self.acc_bits
        wmin = self.widths[0]
        nseg = 32 // wmin
        seg = max(-(-(w + _clog2(self.workers)) * wmin // w) for w in self.widths)
        return nseg * seg + nseg - 1 + 32

    @property
    def header_beats(self) -> int:
        return -(-HEADER_WORDS // self.lanes)

    @property
    def elem_beats(self) -> int:
        """Beats of elements in a full packet: ceil(E / L)."""
        return -(-self.elements // self.lanes)

    @property
    def ideal_beats(self) -> int:
        """Cycles per full packet at one beat per cycle: ceil(E/L) + header beats."""
        return self.elem_beats + self.header_beats

    @property
    def records(self) -> int:
        """Slot records in the core: jobs x 2W."""
        return self.jobs * 2 * self.window

    @property
    def meta_bits(self) -> int:
        """Per-record state besides the accumulators: tag (34, signed), complete,
        bitmap, count, max exponent, overflow, deadline time (32), nelem; with ``tree``
        the workers covered and a child's OVERFLOW."""
        return (34 + 1 + self.workers + _clog2(self.workers + 1) + 8 + 1 + 32
                + _clog2(self.elements + 1) + (TREE_COUNT_BITS + 1 if self.tree else 0)
                + (LEAF_META_BITS if self.leaf else 0))

    @property
    def slot_memory_bits(self) -> int:
        acc = self.elem_beats * self.lanes * self.acc_word_bits
        return self.records * (acc + self.meta_bits)

    @property
    def slot_memory_bytes(self) -> int:
        """Bytes of on-chip slot state (accumulators + per-slot metadata)."""
        return math.ceil(self.slot_memory_bits / 8)

    def describe(self) -> str:
        return (f"N<={self.workers} W={self.window} E={self.elements} L={self.lanes} "
                f"jobs={self.jobs}{' tree' if self.tree else ''}{' leaf' if self.leaf else ''}"
                + (f" widths={','.join(map(str, self.widths))}" if self.narrow else "")
                + f": {self.slot_memory_bytes} B slot state")
