"""Reference aggregator + replicator (DESIGN.md, "Aggregator semantics").

Pure and deterministic: no sockets, no clock. ``process(datagram, source, now)`` returns
the datagrams to send as ``[(destination, bytes)]``; ``tick(now)`` fires deadlines.
``process`` calls ``tick(now)`` first, so a packet that arrives after its slot's deadline
is late, whatever the caller's tick rate. Counters are in ``self.counters``.

Slots. A job with window W (a power of two) has 2W slots: seq ``s`` maps to index
``s % W`` in set ``(s // W) % 2``. Each (set, index) record holds one seq at a time (its
*tag*). Before any traffic, record (set, i) holds the virtual, complete seq
``i + set*W - 2W`` (mod 2^32). Sequence numbers are 32-bit and every comparison is
modular (serial-number arithmetic, as TCP's), so a job runs across the 2^32 wrap. For a
DATA packet with seq ``s`` and the record's tag ``t``:

* ``s == t``: join the slot (add, duplicate, late or re-send; see below);
* ``s == t + 2W`` and the record is complete: the record is reused and opens for ``s``;
* ``s`` before ``t`` (``(t - s) mod 2^32`` in 1 .. 2^31-1): *stale* drop (the slot has
  moved on; its result is gone);
* otherwise: *out-of-window* drop (the worker is ahead of the window).

Modes (``jobtable.MODES``). *reliable*: a slot closes when all N workers contributed.
*bounded*: also at its deadline (``deadline`` after it opened), as a PARTIAL result with
the exact contributor bitmap. *bounded-skip* (software switches only): bounded, and a
worker that a slot closed without at its deadline is *absent*: every open or later slot
of the job closes as soon as all the other workers contributed (counted ``skipped``),
until the absent worker is back: a contribution of its own (DATA that opens a slot or
joins an open one: it is in step again), or, once one deadline has passed since it
became absent, DATA of its own (late or a re-send) for a slot that closed here, if it
came before that slot's own deadline (``opened_at + deadline``): in plain bounded mode
it would have been in the sum, so the worker is less than a deadline behind. Stale,
out-of-window DATA and DATA that missed their slot's deadline do not bring it back: a
worker still a deadline or more behind, waited for again, would only hold the next slots
for a whole deadline and be skipped again (a straggler catching up re-admitted so, and
skipped, twice in one call, cost the others two deadlines a call; ``ina bench fabric
--straggler-ms``). A compute straggler then holds the job for one deadline, not one per
window of slots (issue 18, run 7): with a window of W and a call of P datagrams, bounded
mode waits for it up to ceil(P/W) deadlines. The hold-off (issue 18, runs 40-48): a
worker behind a flooded uplink loses some DATA and delivers the rest a queue's delay
late; if its late DATA re-admitted it at once, every DATA of it that the flood drops would
hold a slot for a whole deadline again, several times a call. A worker that is merely
last at every slot (a slower host, less than a deadline behind) is still waited for again
within one deadline, so it is not skipped for long. (Back-offs that start at 0 and grow
on repeated skips were tried on the lab: no better for compute stragglers, where the
hold-off costs nothing measurable, and worse beside a flood; docs/tail.md, "Runs 40-48".)

Accumulation is exact (int64; 32 int32 values cannot overflow it) and the result is
saturated to int32 when it is emitted, with OVERFLOW set if any element saturated.

Element widths (issue 40, docs/precision.md). A DATA's ``width`` byte names its
elements' width (int32, int16 or int8; ``fields.width_byte``). The DATA that opens a slot
sets the slot's width; a member's DATA of another width is ``drop_bad_width``, answered
with ``Refusal.BAD_WIDTH`` (bitmap: the slot's width byte). Narrow elements are summed
into the same int64 accumulators, and the RESULT carries the slot's width, saturated to
its range once, when emitted (OVERFLOW, ``overflows``), as int32 is. The client scales so
that the sum of N workers fits (headroom S = bits - 1 - ceil(log2 N)).
Saturating at each add would make the result depend on arrival order; this way every
order gives the same bytes, which the gateware matches with 37-bit accumulators.

Trees of switches (docs/fabric.md). A job entry may name a *parent* (``cfg.parent``, and
this switch's member id there, ``cfg.index``) and may have *child switches* as members
(``cfg.children``). Every switch of the tree holds the job under the same id and session,
with its own window, mode and deadline. Per level:

* a slot *closes* when every member contributed, or at this switch's deadline (bounded),
  or when the members that are not absent did (bounded-skip): the same rules as above,
  with "all members" read as the bitmap being full;
* closing at a switch with a parent does not emit a RESULT: the switch sends one DATA to
  the parent (``up``) as member ``cfg.index`` of the parent's job, with the saturated
  partial sum (int32, saturated; a narrow slot's goes up wider and exact,
  ``fields.up_width``: int8 as int16, int16 as int32, with the RESULT's width in the
  width byte's high nibble), ``count`` = the workers it covers, ``bitmap`` = its own members,
  the exponent max, OVERFLOW if it saturated or a child's DATA had it. The slot is then
  *up*: it takes no more contributions (a late member's DATA is counted ``late``), and a
  member's re-sent DATA sends the stored upward DATA again (``up_resent``, RETRANSMIT),
  which is how a lost upward DATA or a lost RESULT of the parent is recovered;
* closing at the root emits the RESULT: ``count`` = workers in the sum (the DATA of a
  worker counts 1, the DATA of a child switch its ``count``), PARTIAL when that is below
  ``cfg.total`` (the job's workers), ``bitmap`` = the root's members;
* the leaves relay (``relayed``): a RESULT from the parent, for a slot that is up, is
  stored and sent to the switch's group, the same bytes except ``worker`` (GROUP_WORKER),
  RETRANSMIT (cleared) and ``bitmap``, rewritten level by level to this switch's own
  members: its slot's bitmap if the parent's bitmap has this switch's bit, else 0 (its
  partial sum came too late: none of its members is in the sum). A worker thus reads
  bit w of a RESULT as "my leaf's member w is in this sum", as with one switch, and every
  worker gets the same payload, count, exponent and PARTIAL/OVERFLOW flags. The stored
  result answers re-sends at the lowest level that has it.
* a RESULT that no up slot awaits (a duplicate, a stale one) is ``drop_result``.

Bounded mode has a deadline per level: a straggler costs its leaf one deadline, the
leaf's partial sum then reaches the spine, whose deadline (longer than the leaves') only
fires when a whole subtree is silent.

The shared slot pool (issue 39, docs/pool.md; ``pool_slots``, ``ina switch --pool-slots``).
The flat jobs of a switch with a pool share ``pool_slots`` slots of memory instead of
holding 2W each, and no job is refused for memory. A slot takes a pool slot when it opens
and gives it back when its record is reused, when its job goes, or as soon as every
member contributed the seq one window on (each member then has its RESULT: a worker sends
``s`` only once it has the result of ``s - W``), so a job at speed holds about W slots,
or, sooner, once every member's *ack* is past it: a worker's DATA may carry in ``count``
the distance ``d`` from its seq to the results it holds (it has the RESULT of every seq
up to ``seq - d``; 0: it says nothing), and the slots below the lowest of the members'
acks give their pool slots back. A job then holds about the slots its workers have in
flight, which their congestion windows bound (docs/congestion.md), instead of W more.
A slot that opens while the pool is full is *over*: it holds no memory, and every DATA
of its seq (re-sends included) goes on to the switch's parent, unchanged but for the
FORWARDED flag (``overflow``). The parent holds the same job (members, session, window)
and takes FORWARDED DATA from any source that carries the session (``overflow_in``),
opens the slot for any later seq of its record (it sees only the overflowing ones), sums
it as any other and sends the RESULT, and any unicast re-send, to the switch that
forwarded; that switch relays it to the job's group, or to the one worker it names,
without storing it (``relayed``). Results are exact, as without a pool. Slots of tree
jobs, and those a parent opens for forwarded DATA, are outside the pool.

Refusals (issue 43). DATA dropped for a reason its sender can fix (an unknown job, a
source that is not the job's member, more elements than the job's or than the slot's,
another session, a seq behind the job) is answered with one ERROR (``fields.Refusal``):
the header alone, never larger than the DATA, at most once per ``ERROR_INTERVAL`` per
source bucket (``fields.error_bucket``; the drop is counted either way). A STALE answer
carries the job's *position*: the seq after the newest slot it opened (``head``), the
seq a new run of a static job resumes at. Truncated, malformed and out-of-window DATA
(the sender is ahead: it only has to wait) get no answer.
"""

from collections import Counter
import heapq
import json

import numpy as np

from ina_fabric.protocol.fields import (HEADER_BYTES, VERSION, MsgType, Flags, NO_EXPONENT,
                                        GROUP_WORKER, MAX_JOB_WORKERS, field_offsets, Refusal,
                                        ERROR_INTERVAL, ERROR_SOURCES, error_bucket,
                                        valid_width, elem_bytes, sum_width, up_width,
                                        width_byte, WIDTH_BITS)
from ina_fabric.protocol.numpy_view import HEADER_DTYPE, ELEM_DTYPE
from ina_fabric.protocol.jobtable import IDLE_RECLAIM_S
from ina_fabric.protocol.auth import (ReplayGuard, seal, unseal, TRAILER_BYTES,
                                      control_length_ok, STATUS_MIN_REQUEST,
                                      status_length_ok)

__all__ = ["SwitchModel", "COUNTERS", "INT32_MIN", "INT32_MAX", "GROUP_WORKER", "BOUNDED",
           "ANSWER_COUNTERS", "error_datagram"]

from ina_fabric.protocol.counters import MODEL_COUNTERS, ANSWER_COUNTERS  # noqa: E402

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
#: the modes whose slots close at a deadline (jobtable.MODES)
BOUNDED = ("bounded", "bounded-skip")
SEQ_MASK = 0xFFFFFFFF
#: the pool's congestion mark (docs/congestion.md): a RESULT carries CONGESTED while at
#: least ``N - N // POOL_MARK_DIV`` of the N pool slots are held (7/8), before the pool
#: is full, as an ECN queue marks past a threshold below its size: the clients' windows
#: back off while new slots still fit, instead of after they began to overflow
POOL_MARK_DIV = 8

#: the counters the model keeps, by name (defined once: ``ina_fabric.protocol.counters``,
#: with what each counts); ANSWER_COUNTERS: those of a switch that answers refused DATA
COUNTERS = MODEL_COUNTERS

_OFF = field_offsets()

#: (STATUS_MIN_REQUEST: a STATUS_REQ is padded to at least this many bytes, and a STATUS
#: reply is never larger than the request that asked for it; ina_fabric.protocol.auth)
#: a STATUS_REQ payload: zero padding, then the first job id wanted (big-endian u32) in
#: its last four bytes; the reply says where the next page starts ("next_job")

#: admission control of the software switch (the FPGA's limits are its job-table size
#: and slot memory): jobs, slot memory per job and in all (accumulators and stored
#: results: 2W slots of E elements, 12 bytes each)
MAX_JOBS = 4096
MAX_JOB_BYTES = 64 << 20
MAX_TOTAL_BYTES = 1 << 30
#: (IDLE_RECLAIM_S: a job id is held by its session while active within it;
#: ina_fabric.protocol.jobtable, where the gateware reads it too)


#: element dtype of each width code (big-endian, as on the wire)
_ELEM = {0: ELEM_DTYPE, 1: np.dtype(">i2"), 2: np.dtype("i1")}


def _result_byte(width: int) -> int:
    """The width byte of the RESULT of a slot opened by DATA with ``width``: its elements
    are the result's width."""
    return (width >> 4) | (width & 0xF0)


def _member_width(cfg, width: int) -> int:
    """The width byte a member's DATA must carry, given the result width it names: a
    worker's elements are the result's width; a child switch's are ``up_width``."""
    bits = sum_width(width)
    return width_byte(up_width(bits, cfg.total) if cfg.children else bits, bits)


def _clip(acc, width: int):
    """Saturate accumulators to the range of the elements of ``width`` (the low nibble)."""
    bits = WIDTH_BITS[width & 0xF]
    return np.clip(acc, -(1 << bits - 1), (1 << bits - 1) - 1)


def _full(n: int) -> int:
    """The bitmap of n members, all in."""
    return (1 << n) - 1


def job_bytes(cfg) -> int:
    """Slot memory a job may use in the software switch."""
    return 2 * cfg.window * cfg.elements * 12


class _Slot:
    __slots__ = ("tag", "complete", "acc", "nelem", "bitmap", "count", "exponent",
                 "opened_at", "result", "up", "overflow", "held", "over", "via",
                 "width")

    def __init__(self, tag):
        self.tag = tag
        self.complete = True
        self.acc = None
        self.nelem = 0
        self.bitmap = 0
        self.count = 0
        self.exponent = NO_EXPONENT
        self.opened_at = 0.0
        self.result = None  # header+payload bytes of the emitted RESULT
        self.up = None      # tree: the DATA sent to the parent, while its RESULT is awaited
        self.overflow = False   # a child switch's DATA was saturated (OVERFLOW)
        self.held = False   # pool: holds one of the switch's pool slots (docs/pool.md)
        self.over = False   # pool: no slot was free when it opened: its DATA go to the parent
        self.via = None     # parent of a pool: the child switch whose FORWARDED DATA it sums
        self.width = 0      # the width byte of the DATA that opened it (int32: 0)


class _Tally:
    """``c[name] += 1`` into the switch's counters and one job's at once: every count
    made once a datagram's job is found (the job's own counters, ``JOB_COUNTERS``)."""
    __slots__ = ("switch", "job")

    def __init__(self, switch, job):
        self.switch, self.job = switch, job

    def __getitem__(self, name):
        return self.switch[name]

    def __setitem__(self, name, value):
        self.job[name] += value - self.switch[name]
        self.switch[name] = value


class _JobState:
    def __init__(self, cfg, now=0.0):
        self.cfg = cfg
        self.counts = Counter()   # this job's share of the counters (JOB_COUNTERS)
        self.active = now     # last install or accepted DATA (job ids held by sessions)
        w = cfg.window
        self.slots = [[_Slot((i + s * w - 2 * w) & SEQ_MASK) for i in range(w)]
                      for s in range(2)]
        self.open = {}  # seq -> slot, in opening order (deadline order within a job)
        self.head = 0   # the job's position: the seq after the newest slot it opened
        #: bounded-skip: workers a slot closed without at its deadline, not back since
        #: (a bitmap; always 0 in the other modes), and when each became absent
        self.absent = 0
        self.absent_since = [0.0] * cfg.n
        self.group = [cfg.mcast] if cfg.mcast else [m.addr for m in cfg.members]
        #: pool (docs/pool.md): each member has the RESULT of every seq below its
        #: ``acked`` (from the ``count`` of its DATA); the stored results below ``freed``
        #: (the lowest ack when last looked at) went back to the pool
        self.acked = [0] * cfg.n
        self.freed = 0


class SwitchModel:
    """The aggregator for a set of jobs (``JobConfig``), with admission limits."""

    def __init__(self, jobs=(), *, key: bytes | None = None, max_jobs=MAX_JOBS,
                 max_job_bytes=MAX_JOB_BYTES, max_total_bytes=MAX_TOTAL_BYTES,
                 modes=None, answers=True, parent=None, pool_slots=None, widths=None,
                 error_interval=ERROR_INTERVAL):
        """``key``: the control key (``ina_fabric.protocol.auth``). CONTROL and STATUS_REQ
        are taken only when sealed with it; without a key, none is taken over the wire
        (jobs come from ``jobs`` and ``add_job``). ``modes``: the modes this switch runs
        (default: all of ``jobtable.MODES``; the gateware's scoreboard passes
        ``GATEWARE_MODES``): a CONTROL entry with another is ``drop_malformed``, as the
        gateware's parse drops it, and ``add_job`` refuses it. ``answers``: DATA refused
        for a reason the sender can fix is answered with an ERROR (the module's
        docstring), at most once per ``error_interval`` (in ``now``'s unit: the
        gateware's scoreboards give the core's interval in cycles, scaled) per source
        bucket; False: refused DATA is only counted.
        ``parent``: this switch's parent ``(ip, port)`` (``ina switch --parent``): a tree
        entry naming another parent is refused (None: whatever parent an entry names).
        ``pool_slots``: the shared slot pool (docs/pool.md): at most this many slots of the
        flat jobs, all together, hold memory at once; a job is then never refused for
        memory (``max_total_bytes`` does not apply), and the DATA of a slot that finds the
        pool full goes on to ``parent`` (needed), which sums it. None: every job keeps its
        own 2W slots, as before. (Slots of tree jobs, and those a parent opens for a
        child's overflow, are outside the pool: their memory is the switch's own.)
        ``widths``: the element widths (bits) this switch sums (default 32, 16 and 8); a
        DATA of another width is ``drop_malformed``, as a switch that predates widths
        drops it (its length is not ``nelem * 4``)."""
        self.widths = tuple(WIDTH_BITS.values() if widths is None else widths)
        if pool_slots is not None and int(pool_slots) < 0:
            raise ValueError(f"pool_slots {pool_slots}: must be >= 0")
        if pool_slots is not None and parent is None:
            raise ValueError("a slot pool needs a parent switch to take its overflow "
                             "(ina switch --pool-slots N --parent HOST:PORT)")
        self.pool_slots = None if pool_slots is None else int(pool_slots)
        self._pool_used = 0
        self.parent = None if parent is None else (str(parent[0]), int(parent[1]))
        from ina_fabric.protocol.jobtable import MODES
        self.modes = tuple(MODES if modes is None else modes)
        self.key = key
        self._replay = ReplayGuard()
        self.jobs: dict[int, _JobState] = {}
        # (a switch without bounded-skip, as the gateware, has no "skipped" counter)
        self.answers = answers
        self.error_interval = error_interval
        self._answered = [None] * ERROR_SOURCES    # when each source bucket was answered
        self._counts = Counter({name: 0 for name in COUNTERS
                                if (name != "skipped" or "bounded-skip" in self.modes)
                                and (answers or name not in ANSWER_COUNTERS)})
        self.max_jobs, self.max_job_bytes = max_jobs, max_job_bytes
        self.max_total_bytes = max_total_bytes
        self._deadlines = []   # heap of (time, job, seq, opened_at): bounded open slots
        for cfg in jobs:
            self.add_job(cfg)

    def add_job(self, cfg, now=None):
        """Install a job: its slots start afresh, also when it is installed again (a new
        run never sees the previous run's slots or results). Raises ConfigError when the
        admission limits refuse it, or (an install over the wire, at time ``now``) when
        the id is held by another session that was active within ``IDLE_RECLAIM_S``:
        a second tenant never replaces a running job. Without ``now`` (the switch's own
        process installing) the job is replaced."""
        from ina_fabric.protocol.jobtable import ConfigError
        if cfg.mode not in self.modes:
            raise ConfigError(f"job {cfg.job}: mode {cfg.mode!r} is not run by this switch "
                              f"(it runs {', '.join(self.modes)})")
        if self.parent is not None and cfg.parent is not None and cfg.parent != self.parent:
            raise ConfigError(f"job {cfg.job}: its entry names parent {cfg.parent[0]}:"
                              f"{cfg.parent[1]}, but this switch's parent is "
                              f"{self.parent[0]}:{self.parent[1]}")
        held = self.jobs.get(cfg.job)
        if now is not None and held is not None and held.cfg.session != cfg.session \
                and now - held.active < IDLE_RECLAIM_S:
            raise ConfigError(f"job {cfg.job} is taken by another run (active "
                              f"{now - held.active:.0f} s ago); remove it first or use "
                              f"another job id")
        need = job_bytes(cfg)
        if need > self.max_job_bytes:
            raise ConfigError(f"job {cfg.job}: {need} B of slot memory (2 x window "
                              f"{cfg.window} x {cfg.elements} elements x 12 B) exceeds the "
                              f"per-job limit of {self.max_job_bytes} B")
        others = [js for j, js in self.jobs.items() if j != cfg.job]
        if len(others) >= self.max_jobs:
            raise ConfigError(f"job {cfg.job}: the switch holds {len(others)} jobs, its "
                              f"limit")
        used = sum(job_bytes(js.cfg) for js in others)
        if self.pool_slots is None and used + need > self.max_total_bytes:
            raise ConfigError(f"job {cfg.job}: {need} B of slot memory, but only "
                              f"{self.max_total_bytes - used} B of {self.max_total_bytes} "
                              f"B are free")
        if held is not None:
            self._release_job(held)
        self.jobs[cfg.job] = _JobState(cfg, 0.0 if now is None else now)

    def update_job(self, cfg):
        """A live update of an installed job: only the deadline may change, and the
        slots (with whatever is in flight) are kept. Raises ConfigError otherwise."""
        from ina_fabric.protocol.jobtable import ConfigError
        js = self.jobs.get(cfg.job)
        if js is None:
            raise ConfigError(f"job {cfg.job}: live update of a job that is not installed")
        if js.cfg.session != cfg.session:
            raise ConfigError(f"job {cfg.job}: live update from another session")
        if (js.cfg.members, js.cfg.window, js.cfg.elements, js.cfg.mode, js.cfg.mcast,
                js.cfg.parent, js.cfg.index, js.cfg.children, js.cfg.total) != (
                cfg.members, cfg.window, cfg.elements, cfg.mode, cfg.mcast,
                cfg.parent, cfg.index, cfg.children, cfg.total):
            raise ConfigError(f"job {cfg.job}: a live update may change only the deadline; "
                              f"install the job anew to change anything else")
        self._retune(js, cfg)

    def retune(self, job: int, **changes):
        """Change an installed job's ``deadline`` and/or ``mode`` in place, keeping its
        slots: the in-process hook of the ``LiveSwitch`` bench harness (which calibrates
        in reliable mode, then goes bounded). Over the wire only the deadline may change
        live (``update_job``)."""
        import dataclasses
        js = self.jobs[job]
        self._retune(js, dataclasses.replace(js.cfg, **changes))

    def _retune(self, js, cfg):
        js.cfg = cfg
        if cfg.mode != "bounded-skip":
            js.absent = 0
        if cfg.mode in BOUNDED:     # the open slots' deadlines move with it
            for seq, slot in list(js.open.items()):
                heapq.heappush(self._deadlines,
                               (slot.opened_at + cfg.deadline, cfg.job, seq, slot.opened_at))

    def remove_job(self, job: int, session: int = 0):
        """Remove job ``job`` (when ``session`` is given, only while the job holds it:
        a run removes its own job, never its successor's)."""
        from ina_fabric.protocol.jobtable import ConfigError
        js = self.jobs.get(job)
        if js is not None and session and js.cfg.session != session:
            raise ConfigError(f"job {job}: held by another session; not removed")
        if js is not None:
            self._release_job(js)
        self.jobs.pop(job, None)

    # -- the shared slot pool (docs/pool.md) -------------------------------------------
    @property
    def pool_used(self) -> int:
        """Pool slots held now."""
        return self._pool_used

    def _release(self, slot):
        if slot.held:
            slot.held = False
            self._pool_used -= 1

    def _release_job(self, js):
        for half in js.slots:
            for slot in half:
                self._release(slot)

    def _take(self, slot) -> bool:
        """A slot of a flat job opens: it takes a pool slot if one is free (always true
        without a pool)."""
        if self.pool_slots is None:
            return True
        if self.pool_used >= self.pool_slots:
            return False
        slot.held = True
        self._pool_used += 1
        return True

    def _confirmed(self, js, seq):
        """Every member contributed ``seq``: each has the RESULT of ``seq - W`` (a worker
        sends ``s`` only once it has the result of ``s - W``), so, with a pool, that
        stored result is freed and its slot goes back to the pool."""
        if self.pool_slots is None:
            return
        w = js.cfg.window
        prev = (seq - w) & SEQ_MASK
        slot = js.slots[(prev // w) % 2][prev % w]
        if slot.held and slot.tag == prev and slot.complete and slot.up is None:
            slot.result = None
            self._release(slot)

    def _ack(self, js, worker, seq, d):
        """A member's DATA of ``seq`` says it has the RESULT of every seq up to
        ``seq - d`` (``d`` > 0, the ``count`` of a worker's DATA to a switch with a
        pool): once every member's ack is past a slot, its stored result is freed and
        its pool slot goes back, as when the seq one window on is complete."""
        a = (seq - d + 1) & SEQ_MASK
        if not 0 < ((a - js.acked[worker]) & SEQ_MASK) < 1 << 31:
            return                          # not ahead of what it said before
        js.acked[worker] = a
        low = js.acked[0]
        for x in js.acked:
            if 0 < ((low - x) & SEQ_MASK) < 1 << 31:
                low = x
        n = (low - js.freed) & SEQ_MASK
        if not 0 < n < 1 << 31:
            return
        w = js.cfg.window
        s = js.freed if n <= 2 * w else (low - 2 * w) & SEQ_MASK
        js.freed = low
        while s != low:
            slot = js.slots[(s // w) % 2][s % w]
            if slot.held and slot.tag == s and slot.complete and slot.up is None:
                slot.result = None
                self._release(slot)
            s = (s + 1) & SEQ_MASK

    def _pool_full(self) -> bool:
        """The congestion signal (docs/congestion.md): the pool is nearly full (7/8 of
        its slots held, ``POOL_MARK_DIV``), and new slots will soon go to the parent; a
        RESULT sent now carries CONGESTED."""
        n = self.pool_slots
        return n is not None and self._pool_used >= n - n // POOL_MARK_DIV

    def _forward(self, js, slot, datagram):
        """The slot found the pool full: the DATA goes on to the parent (FORWARDED)."""
        _Tally(self._counts, js.counts)["overflow"] += 1
        b = bytearray(datagram)
        b[_OFF["flags"]] |= Flags.FORWARDED
        return [(self.parent, bytes(b))]

    def start_at(self, job: int, seq: int):
        """Set an idle job's records as if it had run ``seq`` packets, so that its next
        packet is ``seq`` (after an install, records wait for seq 0). For tests that run
        a job across the 2^32 wrap."""
        js = self.jobs[job]
        w2 = 2 * js.cfg.window
        for k in range(w2):
            slot = js.slots[k // js.cfg.window][k % js.cfg.window]
            self._release(slot)
            slot.__init__((seq - w2 + ((k - seq) % w2)) & SEQ_MASK)
        js.open.clear()
        js.head = seq & SEQ_MASK
        js.acked = [js.head] * js.cfg.n
        js.freed = js.head

    # -- deadlines -------------------------------------------------------------------
    # Bounded open slots sit in one heap by deadline, so a packet's cost does not grow
    # with the number of jobs. An entry is stale (and skipped) once its slot closed, its
    # job went away or was installed anew, or a live update moved its deadline.
    def _live(self, entry):
        t, job, seq, opened_at = entry
        js = self.jobs.get(job)
        slot = js.open.get(seq) if js is not None and js.cfg.mode in BOUNDED else None
        return slot is not None and slot.opened_at == opened_at and \
            opened_at + js.cfg.deadline == t

    def tick(self, now: float):
        out = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if self._live(entry):
                js = self.jobs[entry[1]]
                slot = js.open.pop(entry[2])
                out += self._close(js, slot)
                if js.cfg.mode == "bounded-skip" and slot.bitmap != _full(js.cfg.n):
                    out += self._skip(js, slot.bitmap, now)
        return out

    def _skip(self, js, bitmap, now):
        """bounded-skip: a slot closed at its deadline without the workers missing from
        ``bitmap``; they are absent until they are back (the module's docstring), and
        every open slot of the job that has all the other workers' contributions closes
        now, in opening order (a straggler holds a call for one deadline, not one per
        window of slots)."""
        full = (1 << js.cfg.n) - 1
        new = full & ~bitmap & ~js.absent
        for w in range(js.cfg.n):
            if new >> w & 1:
                js.absent_since[w] = now
        js.absent |= new
        out = []
        for seq, slot in list(js.open.items()):
            if slot.bitmap | js.absent == full:
                _Tally(self._counts, js.counts)["skipped"] += 1
                del js.open[seq]
                out += self._close(js, slot)
        return out

    def next_deadline(self):
        """Earliest time at which ``tick`` has work, or None."""
        heap = self._deadlines
        while heap and not self._live(heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    # -- packets ---------------------------------------------------------------------
    @property
    def counters(self) -> Counter:
        """Every counter (``COUNTERS``), by name."""
        return self._counts

    def job_counters(self, job: int) -> dict:
        """Job ``job``'s own counters (those not zero): the counts made for datagrams of
        the job (after its lookup: ``JOB_COUNTERS``) and for its slots' results, since
        it was installed (a live update keeps them)."""
        return {k: v for k, v in sorted(self.jobs[job].counts.items()) if v}

    def process(self, datagram: bytes, source, now: float):
        """Fire the deadlines due at ``now``, then take one datagram from ``source``.
        Returns the datagrams to send, ``[(destination, bytes)]``."""
        return self.tick(now) + self._receive(datagram, source, now)

    def _receive(self, datagram, source, now):
        out = []
        c = self._counts
        c["rx"] += 1
        n = len(datagram)
        if n < HEADER_BYTES:
            c["drop_truncated"] += 1
            return out
        h = np.frombuffer(datagram, HEADER_DTYPE, count=1)[0]
        if h["version"] != VERSION:
            c["drop_bad_version"] += 1
            return out
        mtype = int(h["type"])
        if mtype in (MsgType.STATUS_REQ, MsgType.CONTROL):
            return self._control_datagram(mtype, datagram, source, now)
        if mtype != MsgType.DATA and not (mtype == MsgType.RESULT and self._has_parent(h)):
            c["drop_malformed"] += 1          # (a switch takes RESULTs only from a parent)
            return out
        nelem, width = int(h["nelem"]), self._sized(h, n)
        if width is None:
            return out
        js = self.jobs.get(int(h["job"]))
        if js is None:
            c["drop_unknown_job"] += 1
            return out + self._refuse(Refusal.UNKNOWN_JOB, 0, datagram, source, now)
        cfg = js.cfg
        c = _Tally(c, js.counts)      # from here on, every count is also the job's
        if mtype == MsgType.RESULT:
            return self._from_parent(js, h, datagram, source, now)
        if int(h["session"]) != cfg.session:
            c["drop_bad_session"] += 1
            return out + self._refuse(Refusal.BAD_SESSION, 0, datagram, source, now)
        worker = int(h["worker"])
        # a child switch's pool overflow (docs/pool.md): its source is that switch, the
        # session is the capability, as for every DATA
        fwd = bool(h["flags"] & Flags.FORWARDED) and not cfg.tree
        if worker >= cfg.n or (not fwd and cfg.members[worker].addr != tuple(source)):
            c["drop_unknown_source"] += 1
            return out + self._refuse(Refusal.NOT_MEMBER, cfg.n, datagram, source, now)
        if nelem > cfg.elements:
            c["drop_malformed"] += 1
            return out + self._refuse(Refusal.BAD_LENGTH, cfg.elements, datagram, source,
                                      now)
        # the workers this DATA covers: one for a worker, the count of a child switch
        covers = int(h["count"]) if cfg.children else 1
        # (and a worker's width nibbles agree; a child's partial sum is up_width wide)
        if not 1 <= covers <= cfg.total or width != _member_width(cfg, width):
            c["drop_malformed"] += 1
            return out
        c["rx_data"] += 1
        if fwd:
            c["overflow_in"] += 1
        seq = int(h["seq"])
        if self.pool_slots is not None and not (fwd or cfg.tree) and h["count"]:
            self._ack(js, worker, seq, int(h["count"]))
        w = cfg.window
        slot = js.slots[(seq // w) % 2][seq % w]
        bit = 1 << worker
        ahead = (seq - slot.tag) & SEQ_MASK
        # (a parent sees only the slots a child's pool could not hold: any later seq of
        # the record opens it)
        if slot.complete and (ahead == 2 * w or (fwd and 0 < ahead < 1 << 31)):
            self._release(slot)
            slot.over = False
            if not (fwd or cfg.tree or self._take(slot)):
                slot.tag, slot.result, slot.acc, slot.up = seq, None, None, None
                slot.nelem, slot.bitmap, slot.count, slot.over = nelem, 0, 0, True
                if ((seq + 1 - js.head) & SEQ_MASK) < 1 << 31:
                    js.head = (seq + 1) & SEQ_MASK
                js.active = now
                return out + self._forward(js, slot, datagram)
            slot.via = tuple(source) if fwd else None
            self._open(js, slot, seq, nelem, width, now)
        elif seq != slot.tag:
            behind = 0 < ((slot.tag - seq) & SEQ_MASK) < 1 << 31
            c["drop_stale" if behind else "drop_out_of_window"] += 1
            if behind:
                out += self._refuse(Refusal.STALE, js.head, datagram, source, now)
            return out
        if slot.over:                  # the pool was full when it opened: the parent sums it
            if fwd:         # (overflow goes up one level, never further: a misconfiguration)
                c["drop_unknown_source"] += 1
                return out
            js.active = now
            return out + self._forward(js, slot, datagram)
        if slot.complete:
            if slot.result is None:
                # the virtual seq a record holds before the job's first traffic: the
                # sender is more than 2W behind the job's start; nothing to re-send
                c["drop_stale"] += 1
                return out + self._refuse(Refusal.STALE, js.head, datagram, source, now)
            self._back_in_time(js, worker, slot, now)
            if slot.bitmap & bit:
                c["duplicates"] += 1
            else:
                c["late"] += 1
            c["resent"] += 1
            to = tuple(source) if fwd else cfg.members[worker].addr
            return out + [(to, self._unicast(slot.result, worker))]
        if slot.up is not None:        # closed here, its RESULT awaited from the parent
            self._back_in_time(js, worker, slot, now)
            if slot.bitmap & bit:
                c["duplicates"] += 1
                c["up_resent"] += 1
                return out + [(cfg.parent, slot.up)]
            c["late"] += 1
            return out
        if slot.bitmap & bit:
            c["duplicates"] += 1
            return out
        if nelem != slot.nelem:
            c["drop_malformed"] += 1
            return out + self._refuse(Refusal.BAD_LENGTH, slot.nelem, datagram, source, now)
        if width != slot.width:
            c["drop_bad_width"] += 1
            return out + self._refuse(Refusal.BAD_WIDTH, slot.width, datagram, source, now)
        c["accepted"] += 1
        js.active = now
        js.absent &= ~bit          # in step again (bounded-skip): slots wait for it again
        if nelem:
            slot.acc += np.frombuffer(datagram, _ELEM[width & 0xF], count=nelem,
                                      offset=HEADER_BYTES)
        slot.bitmap |= bit
        slot.count += covers
        slot.exponent = max(slot.exponent, int(h["exponent"]))
        if cfg.children and h["flags"] & Flags.OVERFLOW:
            slot.overflow = True
        full = _full(cfg.n)
        if slot.bitmap | js.absent == full:
            if slot.bitmap != full:
                c["skipped"] += 1
            else:
                self._confirmed(js, seq)
            del js.open[seq]
            out += self._close(js, slot)
        return out

    @staticmethod
    def _back_in_time(js, worker, slot, now):
        """bounded-skip: DATA of ``worker`` for ``slot``, which closed here before it came
        (late, or a re-send). An absent worker is waited for again only when this DATA
        came before the slot's own deadline (in plain bounded mode it would have been in
        the sum: the worker is less than a deadline behind) and a deadline has passed
        since it became absent (the hold-off). DATA that missed its slot's deadline say
        the worker is still a deadline or more behind: waiting for it would cost a
        deadline again (the module's docstring)."""
        d = js.cfg.deadline
        if js.absent >> worker & 1 and now < slot.opened_at + d and \
                now >= js.absent_since[worker] + d:
            js.absent &= ~(1 << worker)

    def _sized(self, h, n):
        """The width byte of a DATA or RESULT of ``n`` bytes, or None (counted) when it
        names no width this switch sums (``drop_malformed``) or the length is not
        ``nelem`` elements of it (``drop_truncated``, ``drop_malformed``)."""
        c, width = self._counts, int(h["width"])
        if not valid_width(width) or WIDTH_BITS[width & 0xF] not in self.widths or \
                WIDTH_BITS[width >> 4] not in self.widths:
            c["drop_malformed"] += 1
            return None
        body, need = n - HEADER_BYTES, elem_bytes(width) * int(h["nelem"])
        if body != need:
            c["drop_truncated" if body < need else "drop_malformed"] += 1
            return None
        return width

    def _open(self, js, slot, seq, nelem, width, now):
        """Slot ``slot`` opens for ``seq`` (empty, ``nelem`` elements); the job's head
        moves past it; in a bounded mode its deadline goes on the heap."""
        cfg = js.cfg
        slot.tag, slot.complete, slot.result = seq, False, None
        slot.acc = np.zeros(nelem, np.int64)
        slot.nelem, slot.bitmap, slot.count = nelem, 0, 0
        slot.exponent, slot.opened_at = NO_EXPONENT, now
        slot.up, slot.overflow, slot.width = None, False, width
        js.open[seq] = slot
        if ((seq + 1 - js.head) & SEQ_MASK) < 1 << 31:
            js.head = (seq + 1) & SEQ_MASK
        if cfg.mode in BOUNDED:
            heapq.heappush(self._deadlines, (now + cfg.deadline, cfg.job, seq, now))

    def _control_datagram(self, mtype, datagram, source, now):
        """STATUS_REQ (a page of STATUS, never larger than the request) and CONTROL (a
        job-table entry), each sealed with the switch's key: the replies, sealed."""
        c, n = self._counts, len(datagram)
        if mtype == MsgType.STATUS_REQ:
            c["status_requests"] += 1
            if not status_length_ok(n):
                c["status_unpadded"] += 1     # too short (an amplifier), too long, ragged
                return []
            opened = self._authentic(datagram)
            if opened is None:
                return []
            inner, nonce = opened
            start = int.from_bytes(inner[-4:], "big")
            page = self.status_datagram(start, budget=n - TRAILER_BYTES)
            return [(source, seal(page, self.key, nonce))]
        if self.key is not None and not control_length_ok(n):
            c["drop_malformed"] += 1          # no entry fits: not even hashed
            return []
        opened = self._authentic(datagram)
        if opened is None:
            return []
        inner, nonce = opened
        return [(dest, seal(reply, self.key, nonce))
                for dest, reply in self._control(inner, source, now)]

    def _has_parent(self, h) -> bool:
        js = self.jobs.get(int(h["job"]))
        return js is not None and (js.cfg.parent is not None or self._pool_parent(js))

    def _pool_parent(self, js) -> bool:
        """The job's overflow goes to this switch's parent (a flat job, with a pool)."""
        return self.pool_slots is not None and self.parent is not None and not js.cfg.tree

    def _from_parent(self, js, h, datagram, source, now):
        """A RESULT: taken only from the job's parent, for a slot that is up (sent to the
        parent and awaiting this); relayed to the group (the module's docstring)."""
        c, cfg = _Tally(self._counts, js.counts), js.cfg
        if tuple(source) != (cfg.parent if cfg.parent is not None else self.parent):
            c["drop_unknown_source"] += 1
            return []
        if int(h["session"]) != cfg.session:
            c["drop_bad_session"] += 1
            return []
        seq, w = int(h["seq"]), cfg.window
        slot = js.slots[(seq // w) % 2][seq % w]
        if slot.over and slot.tag == seq:
            # the parent summed this slot (the pool was full): relayed, not stored (a
            # re-sent DATA goes to the parent again, whose unicast answer is relayed too)
            worker = int(h["worker"])
            if worker != GROUP_WORKER and worker >= cfg.n:
                c["drop_malformed"] += 1
                return []
            js.active = now
            c["relayed"] += 1
            b = bytearray(datagram)
            if self._pool_full():
                b[_OFF["flags"]] |= Flags.CONGESTED
                c["congested"] += 1
            if worker != GROUP_WORKER:
                return [(cfg.members[worker].addr, bytes(b))]
            b[_OFF["flags"]] &= ~Flags.RETRANSMIT & 0xFF
            return [(dest, bytes(b)) for dest in js.group]
        if slot.up is None or slot.tag != seq:
            c["drop_result"] += 1
            return []
        if int(h["nelem"]) != slot.nelem or int(h["count"]) > MAX_JOB_WORKERS or \
                int(h["width"]) != _result_byte(slot.width):
            c["drop_malformed"] += 1
            return []
        b = bytearray(datagram)
        b[_OFF["worker"]] = GROUP_WORKER
        b[_OFF["flags"]] &= ~Flags.RETRANSMIT & 0xFF
        mine = int(h["bitmap"]) >> cfg.index & 1
        b[_OFF["bitmap"]:_OFF["bitmap"] + 4] = (slot.bitmap if mine else 0).to_bytes(4, "big")
        slot.result, slot.up, slot.complete = bytes(b), None, True
        js.active = now
        c["relayed"] += 1
        return [(dest, slot.result) for dest in js.group]

    def _close(self, js, slot):
        """A slot closes at this level: its RESULT at the root, its partial sum upward
        at a switch with a parent."""
        return self._emit(js, slot) if js.cfg.parent is None else self._send_up(js, slot)

    def _send_up(self, js, slot):
        bits = sum_width(slot.width)
        up = width_byte(up_width(bits, js.cfg.total), bits)
        data = self._sum_datagram(js, slot, MsgType.DATA, js.cfg.index, up)
        slot.up = data[:2] + bytes([data[2] | Flags.RETRANSMIT]) + data[3:]
        _Tally(self._counts, js.counts)["up"] += 1
        return [(js.cfg.parent, data)]

    def _sum_datagram(self, js, slot, mtype, worker, width) -> bytes:
        """The datagram a closing slot sends (a RESULT at the root, the DATA up at a
        switch with a parent), its elements ``width`` wide (the width byte): the sum
        saturated to that width, PARTIAL when it covers fewer than the job's workers,
        OVERFLOW when it saturated or a child's DATA had it (counted). The slot's
        accumulator is released."""
        c, cfg = _Tally(self._counts, js.counts), js.cfg
        flags = Flags.OVERFLOW if slot.overflow else 0
        if slot.count < cfg.total:
            flags |= Flags.PARTIAL
            c["partials"] += 1
        clipped = _clip(slot.acc, width)
        if slot.nelem and not np.array_equal(clipped, slot.acc):
            flags |= Flags.OVERFLOW
            c["overflows"] += 1
        hdr = np.zeros((), HEADER_DTYPE)
        hdr["version"], hdr["type"], hdr["flags"] = VERSION, mtype, flags
        hdr["width"] = width
        hdr["exponent"], hdr["job"], hdr["worker"] = slot.exponent, cfg.job, worker
        hdr["count"], hdr["seq"], hdr["nelem"] = slot.count, slot.tag, slot.nelem
        hdr["bitmap"], hdr["session"] = slot.bitmap, cfg.session
        slot.acc = None
        return hdr.tobytes() + clipped.astype(_ELEM[width & 0xF]).tobytes()

    def _refuse(self, reason, figure, datagram, source, now):
        """The ERROR answering a refused DATA (the module's docstring), or nothing when
        this switch does not answer or answered the source's bucket within
        ``error_interval``."""
        if not self.answers:
            return []
        import socket
        b = error_bucket(int.from_bytes(socket.inet_aton(source[0]), "big"), source[1])
        last = self._answered[b]
        if last is not None and now - last < self.error_interval:
            self._counts["errors_limited"] += 1
            return []
        self._answered[b] = now
        self._counts["errors_sent"] += 1
        return [(source, error_datagram(datagram, reason, figure))]

    def _authentic(self, datagram):
        """(datagram without trailer, nonce) for a control datagram sealed with our key
        and a fresh nonce; None (counted) otherwise. A switch without a key has no
        control plane on the wire: its CONTROL is malformed there, as in the gateware
        today, and a STATUS_REQ goes unanswered."""
        if self.key is None:
            if datagram[1] == MsgType.CONTROL:
                self._counts["drop_malformed"] += 1
            return None
        opened = unseal(datagram, self.key)
        if opened is None or not self._replay.take(opened[1]):
            self._counts["drop_unauthenticated"] += 1
            return None
        return opened

    def _control(self, datagram, source, now):
        """CONTROL: the payload is one job-table entry (``jobtable.parse_control``):
        install (slots afresh), live update (deadline only) or removal. The reply is a
        short STATUS: ``{"ok": true, "job": id}``, or ``{"error": why}`` when the entry
        is refused (admission limits, a live update that changes more than the deadline).
        A malformed entry is a counted drop with no reply."""
        from ina_fabric.protocol.jobtable import ConfigError, parse_control
        try:
            op, value = parse_control(datagram[HEADER_BYTES:])
        except ConfigError:
            self._counts["drop_malformed"] += 1
            return []
        if op != "remove" and value.mode not in self.modes:
            self._counts["drop_malformed"] += 1       # as the gateware's parse drops it
            return []
        try:
            if op == "remove":
                self.remove_job(*value)
            elif op == "update":
                self.update_job(value)
            else:
                self.add_job(value, now)
        except ConfigError as e:
            self._counts["control_refused"] += 1
            return [(source, self._status_bytes({"error": str(e)}))]
        self._counts["control"] += 1
        job = value[0] if op == "remove" else value.job
        return [(source, self._status_bytes({"ok": True, "op": op, "job": job}))]

    # -- results ---------------------------------------------------------------------
    def _emit(self, js, slot):
        c = _Tally(self._counts, js.counts)
        slot.result = self._sum_datagram(js, slot, MsgType.RESULT, GROUP_WORKER,
                                         _result_byte(slot.width))
        if self._pool_full():
            b = bytearray(slot.result)
            b[_OFF["flags"]] |= Flags.CONGESTED
            slot.result = bytes(b)
            c["congested"] += 1
        slot.complete = True
        c["results"] += 1
        return [(dest, slot.result) for dest in ([slot.via] if slot.via else js.group)]

    @staticmethod
    def _unicast(result: bytes, worker: int) -> bytes:
        b = bytearray(result)
        b[_OFF["worker"]] = worker
        b[_OFF["flags"]] |= Flags.RETRANSMIT
        return bytes(b)

    # -- status ----------------------------------------------------------------------
    def _job_status(self, js) -> dict:
        return {"workers": js.cfg.n, "window": js.cfg.window, "elements": js.cfg.elements,
                "mode": js.cfg.mode, "deadline_ms": js.cfg.deadline * 1e3,
                "open_slots": len(js.open), "waiting_for": self._waiting_for(js),
                "session": f"{js.cfg.session:016x}",
                "counters": self.job_counters(js.cfg.job)} | (
                    {"position": js.head} if self.answers else {}) | (
                    {"absent": self._missing(js.cfg.n, ~js.absent)}
                    if js.cfg.mode == "bounded-skip" else {}) | (
                    self._tree_status(js) if js.cfg.tree else {})

    def _tree_status(self, js) -> dict:
        """A tree job: where this switch sits, and how many of its slots closed here and
        wait for the parent's RESULT (a stall above this switch)."""
        cfg = js.cfg
        return {"parent": f"{cfg.parent[0]}:{cfg.parent[1]}" if cfg.parent else None,
                "index": cfg.index, "members_are": "switches" if cfg.children else "workers",
                "total_workers": cfg.total, "awaiting_parent": self._awaiting_parent(js)}

    def _awaiting_parent(self, js) -> int:
        return sum(slot.up is not None for half in js.slots for slot in half)

    @staticmethod
    def _missing(n, bitmap):
        return [w for w in range(n) if not bitmap >> w & 1]

    def _waiting_for(self, js):
        """The workers the oldest open slot still lacks (a stalled job: who stalls it)."""
        for slot in js.open.values():
            return self._missing(js.cfg.n, slot.bitmap)
        return []

    def status(self) -> dict:
        """Everything, as one dict (for the process that holds the model)."""
        return {"counters": dict(self.counters),
                "jobs": {j: self._job_status(js) for j, js in sorted(self.jobs.items())}} | (
                    {"pool": self.pool_status()} if self.pool_slots is not None else {})

    def pool_status(self) -> dict:
        """The shared slot pool: its size and the slots in use now."""
        return {"slots": self.pool_slots, "used": self.pool_used}

    @staticmethod
    def _status_bytes(doc) -> bytes:
        hdr = np.zeros((), HEADER_DTYPE)
        hdr["version"], hdr["type"] = VERSION, MsgType.STATUS
        return hdr.tobytes() + json.dumps(doc, sort_keys=True).encode()

    def status_datagram(self, start: int = 0, budget: int = 65507) -> bytes:
        """One page of STATUS, at most ``budget`` bytes: the counters, the jobs with ids
        from ``start`` on that fit, and ``next_job`` (where the next page starts, or
        None). Page cost is independent of how many jobs the page leaves out."""
        doc = {"counters": dict(self.counters), "jobs": {}, "next_job": None} | (
            {"pool": self.pool_status()} if self.pool_slots is not None else {})
        size = len(self._status_bytes(doc)) + 16
        for j in sorted(j for j in self.jobs if j >= start):
            entry = self._job_status(self.jobs[j])
            add = len(json.dumps({str(j): entry})) + 1
            if size + add > budget and not doc["jobs"]:
                # alone on its page and still too large: its counters are left out (None),
                # so that paging moves on (a larger request gets them)
                entry["counters"] = None
                add = len(json.dumps({str(j): entry})) + 1
            if size + add > budget:
                doc["next_job"] = j
                break
            doc["jobs"][j] = entry
            size += add
        return self._status_bytes(doc)


def error_datagram(data: bytes, reason, figure: int) -> bytes:
    """The ERROR that answers DATA ``data`` (``fields.Refusal``): its header with type
    ERROR, ``count`` the reason, ``bitmap`` the figure, no elements and no flags."""
    b = bytearray(data[:HEADER_BYTES])
    b[_OFF["type"]] = MsgType.ERROR
    b[_OFF["flags"]] = 0
    b[_OFF["exponent"]] = 0
    b[_OFF["count"]:_OFF["count"] + 2] = int(reason).to_bytes(2, "big")
    b[_OFF["nelem"]:_OFF["nelem"] + 2] = bytes(2)
    b[_OFF["width"]] = 0
    b[_OFF["bitmap"]:_OFF["bitmap"] + 4] = (figure & SEQ_MASK).to_bytes(4, "big")
    return bytes(b)
