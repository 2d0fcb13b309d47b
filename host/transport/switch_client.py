"""The worker side of in-network aggregation: a windowed, self-clocked UDP client.

``SwitchClient.allreduce(values)`` sums a float32 vector across the job's workers through
a switch (``ina switch`` or the FPGA). Per call, with K chunks of E elements and window W:

* the call's window ``w`` is a power of two dividing the job's window W (``call_window``);
* packet ``p`` (seq ``base + p``, p = 0 .. K+w-1) carries the data of chunk ``p - w`` (none
  for p < w) and this worker's exponent proposal for chunk ``p`` (see ``host.quantize``);
* packets 0..w-1 go out at once; the RESULT of ``p`` releases packet ``p + w``;
* reliable mode: a packet without a result after ``rto`` is sent again (RETRANSMIT), and
  the switch re-serves a stored result to a worker that repeats a completed seq;
* bounded mode: the switch closes a slot at its deadline with a PARTIAL result; the
  client re-sends only after the deadline (to fetch a stored result it missed), rescales
  a partial sum by N/count, and counts exactly the entries that came from fewer than N
  workers. Every worker applies the very same stored result, so replicas stay identical.

Pacing (``pace_rate``, the worker's link rate; the DDP hook takes it from INA_LINK_RATE):
datagrams go out no faster than the link, so a window released at once does not land in
the host's own link queue (at 10 Mbit/s a 20 ms tbf queue holds 3 jumbo datagrams, and
every call's first data window of 8 lost some there, each costing an rto). The C loop
keeps the waiting datagrams queued and goes on reading RESULTs; a datagram's timer starts
when it really goes. The Python loop sleeps before each send.

Sequence numbers continue across calls (``base`` advances by K+w), so all workers of a
job must make the same sequence of calls with the same sizes, as DDP does.

The window, timers and give-up rule are the pure ``host.transport.window.SendWindow``;
``AllreduceCall`` is a call's data side (packets out, results in), also without I/O; the
socket loop in ``SwitchClient.allreduce`` receives, decodes and performs their actions.

Where the time goes, and what keeps it low (the per-datagram path is Python, so it does
as little as it can; the per-element work is compiled, one pass each way):

* packets are built in a ring of ``w`` reused slots (packet ``p`` in slot ``p % w``: the
  window guarantees ``p``'s result is in before ``p + w`` is built), a header written by
  one ``struct.pack_into`` and the elements by one numba pass (scale, round, byte-swap);
* a RESULT's header is read by one ``struct.unpack_from`` into a tuple of ints, and its
  elements dequantized by one numba pass straight from the receive buffer into the
  output: the caller's ``out`` (``allreduce(x, out=x)`` works in place, as the DDP hook
  does with each bucket) or a fresh ``np.empty``; never a zeroed array and no temporary;
* the exponent scan of the whole input is one integer-max pass over the float bits;
* the window's timer checks are O(1) (``SendWindow``), and the sockets are drained
  without a timeout per receive: one ``poll`` when both are empty;
* multicast RESULTs (``group``): on one host the switch sends one copy of each RESULT to
  the job's group instead of N; the client receives it on a second socket bound to the
  group, and unicast re-sends of stored results still come to its own socket.
"""

from dataclasses import dataclass, field, asdict
import errno
import math
import os
import select
import socket
import struct
import time

import numpy as np

from ina_fabric.protocol.fields import (HEADER_BYTES, VERSION, MsgType, Flags, NO_EXPONENT,
                                        GROUP_WORKER, Refusal, width_byte)
from ina_fabric.protocol.struct_view import (HEADER_STRUCT, H_SESSION, H_BITMAP, H_COUNT,
                                             H_WIDTH)
from ina_fabric.protocol.jobtable import LINK_DEFAULTS, MAX_ELEMENTS
from ina_fabric.protocol.fields import c_layout, MAX_WORKERS, MAX_JOB_WORKERS, field_offsets
from . import quantize as Q
from .precision import Precision, as_precision
from . import fastcall
from .sockbuf import size_buffers, socket_drops, local_queue_bytes, WORKER_RCVBUF
from .window import SendWindow, WindowConfig, RttEstimator, Send, Deliver, Abandon, Hold

#: a datagram this host's own queue refused (ENOBUFS: the socket has IP_RECVERR) goes
#: again LOCAL_RETRY_S later, at most LOCAL_RETRIES times (20 ms, a lab link's tbf
#: queue), then counts as lost (the timers recover it); _client.c's LOCAL_RETRIES
LOCAL_RETRIES = 200
LOCAL_RETRY_S = 1e-4
#: a send the full send buffer refuses (EAGAIN: the worker's share of its host's queue is
#: full, ``sockbuf.local_queue_bytes``) waits for the buffer to drain by half, at most
#: LOCAL_WAIT_S at a time and LOCAL_WAITS times (1 s, a queue that never drains), then
#: counts as lost; _client.c's LOCAL_WAITS
LOCAL_WAITS = 100
LOCAL_WAIT_S = 0.01
#: a call of fewer datagrams says too little of the rate to size the send buffer by
RATE_MIN_PACKETS = 64
#: ``gso="auto"``: the compiled loop sends in runs once the worker's last call sent at
#: least this many bytes/s (250 Mbit/s). Runs save per-datagram work, which limits a host
#: at 1 Gbit/s; at 100 Mbit/s they saved nothing and cost beside UDP floods (1.30x Gloo's
#: time to accuracy with runs, 1.37x without, one half hour; docs/congestion.md,
#: "Sending in runs")
GSO_MIN_RATE = 250e6 / 8
GSO = ("auto", "on", "off")
_IP_RECVERR = getattr(socket, "IP_RECVERR", 11)     # Linux's; Python 3.11 lacks the name


def _drain_errors(sock):
    """Read the ICMP errors queued on ``sock`` (IP_RECVERR queues them, and poll reports
    the socket until they are read)."""
    for _ in range(4096):
        try:
            sock.recvmsg(256, 256, socket.MSG_ERRQUEUE)
        except OSError:          # BlockingIOError: none left
            return


def _send_once(sock, usock, data, switch, stats, win):
    """Send one datagram. A send this host's own queue refuses (ENOBUFS: IP_RECVERR) is
    local congestion: as in the C loop, and as TCP does, the window hears of it and the
    datagram goes again once the queue drained a little, not after a timer. A send the
    full send buffer refuses (EAGAIN) waits until the worker's datagrams in that queue
    have drained by half (``sockbuf.local_queue_bytes``), as the C loop does."""
    waits = retries = 0
    while True:
        try:
            sock.sendto(data, switch)
            return
        except ConnectionRefusedError:   # ICMP: a switch that is down
            _drain_errors(usock)
            return                       # lost; the timers recover it
        except BlockingIOError:
            if waits == LOCAL_WAITS:
                return                   # lost; the timers recover it
            waits += 1
            stats.local_waits += 1
            select.select((), (usock,), (), LOCAL_WAIT_S)
            continue
        except OSError as e:
            if e.errno != errno.ENOBUFS:
                raise
        if retries == LOCAL_RETRIES:
            return                       # lost; the timers recover it
        retries += 1
        stats.local_retries += 1
        win.on_local_congestion(time.monotonic())
        time.sleep(LOCAL_RETRY_S)


_D = LINK_DEFAULTS["ethernet"]
_LAYOUT = c_layout()
_DATA, _RESULT, _ERROR = int(MsgType.DATA), int(MsgType.RESULT), int(MsgType.ERROR)
_PARTIAL, _OVERFLOW = int(Flags.PARTIAL), int(Flags.OVERFLOW)
_CONGESTED = int(Flags.CONGESTED)
_RETRANSMIT, _LAST = int(Flags.RETRANSMIT), int(Flags.LAST)
_COUNT_OFF, _ACK = field_offsets()["count"], struct.Struct(">H")


def ack_of(p: int, low: int) -> int:
    """The ack a DATA of packet ``p`` carries in ``count`` (docs/pool.md): the worker
    has the RESULT of every packet below ``low`` (and of every earlier call's), so of
    every seq up to ``seq - (p - low + 1)``; 0 (no claim) when that does not fit 16
    bits. A switch with a slot pool frees the stored results every member acked."""
    d = p - low + 1
    return d if 0 < d <= 0xFFFF else 0

__all__ = ["SwitchClient", "AllreduceCall", "AllreduceStats", "SwitchUnavailable",
           "SwitchRefused",
           "AllreduceTimeout", "AllreduceTooLate", "AllreduceInconsistent", "JobFailed",
           "warm_up", "static_position"]


def warm_up():
    """Compile or load every numba kernel of the data path (``quantize.warm_up``); call it
    before any timer starts. Returns the seconds it took."""
    return Q.warm_up()


class SwitchUnavailable(ConnectionError):
    """No RESULT came back from the switch at all (down, wrong address, job unknown)."""


class SwitchRefused(ConnectionError):
    """The switch answered this worker's DATA with an ERROR (``fields.Refusal``): a
    mistake the sender can fix (unknown job, not a member, wrong length, another
    session, a seq the job has passed). ``reason`` is the ``Refusal``, ``figure`` the
    switch's figure (members, elements, or the job's position)."""

    def __init__(self, message, reason=None, figure=0):
        super().__init__(message)
        self.reason, self.figure = reason, figure


def static_position(switch, job: int, session: int, timeout=1.0, key=None,
                    settle=1.0, workers: int | None = None) -> int | None:
    """Where a new run of a static job (loaded into the switch beforehand, no CONTROL)
    starts: the job's position, the seq after the newest slot it opened, asked with
    STATUS. A static job cannot be reset by its workers (the FPGA's table is loaded by
    ``ina hw-config``, and a run has no key to install it again), so a second run
    *resumes*: its first packet opens a slot whose previous result (of the earlier
    run) is complete and is overwritten, so no stored result of an earlier run reaches
    the new one. Raises SwitchRefused when the switch holds no such job, holds it under
    another session or (a one-switch job, not a tree's leaf) for another number of
    members than ``workers``, or has slots of an earlier run still open after ``settle``
    seconds
    (a reliable run that failed mid-call: its contributions would mix into the new
    run's sums; load the job again). Returns None when the switch does not answer
    STATUS (no control key here): the run then starts at 0, and the switch's STALE
    answer names the position if the job is further on. Call it on one rank before
    any rank sends, and give every rank the same answer (``SwitchClient.start``)."""
    from ina_fabric.protocol.control_client import query_status
    at = f"the switch at {switch[0]}:{switch[1]}"
    deadline = time.monotonic() + settle
    while True:
        try:
            jobs = query_status(switch, timeout=timeout, key=key).get("jobs", {})
        except Exception:  # noqa: BLE001 (no key, no answer: the STALE answer tells)
            return None
        st = jobs.get(str(job))
        if st is None:
            raise SwitchRefused(f"{at} has no job {job} (a static job must be in its "
                                f"table: `ina hw-config`, `ina switch --local-workers`)",
                                Refusal.UNKNOWN_JOB)
        if st.get("session") not in (None, f"{session:016x}"):
            raise SwitchRefused(f"{at} holds job {job} under another session than "
                                f"{session:#x}: give the session of its [[job]] table "
                                f"(--session / INA_SESSION)", Refusal.BAD_SESSION)
        # a leaf of a tree of switches (STATUS has its parent) holds its own members,
        # a share of the run's workers: only a one-switch job's count must match
        if workers is not None and not st.get("parent") and \
                st.get("workers") not in (None, workers):
            raise SwitchRefused(f"{at} holds job {job} with {st['workers']} member(s), and "
                                f"this run has {workers} workers: start as many workers as "
                                f"the job has members (--workers), or load the job for "
                                f"{workers}", Refusal.NOT_MEMBER, st["workers"])
        if "position" not in st:
            return None
        if not st.get("open_slots"):
            return int(st["position"])
        if time.monotonic() >= deadline:
            raise SwitchRefused(
                f"{at} holds {st['open_slots']} open slot(s) of an earlier run of static "
                f"job {job} (waiting for worker(s) "
                f"{', '.join(map(str, st.get('waiting_for', [])))}): that run failed "
                f"mid-call and its partial sums would mix into this run's; load the job "
                f"again (`ina hw-config`, or restart `ina switch`)", Refusal.STALE)
        time.sleep(0.05)


class AllreduceTimeout(TimeoutError):
    """A reliable allreduce made no progress for ``stall_timeout`` seconds."""


class AllreduceTooLate(AllreduceTimeout):
    """Bounded mode: a result this worker needs is gone for good (the switch reused its
    slot: this worker fell more than a window behind, or the switch lost the job). The
    call fails instead of applying zeros that no other worker applies; the others'
    results of that call do not include this worker."""


class JobFailed(RuntimeError):
    """An earlier call of this client failed; its job must be installed again (a new
    session) before the next call."""


class AllreduceInconsistent(RuntimeError):
    """The switch answered a reliable call with a PARTIAL result (the job was installed
    again as bounded under this run). Every worker gets the same RESULT, so every worker
    raises."""


@dataclass
class AllreduceStats:
    calls: int = 0
    elements: int = 0
    packets_sent: int = 0
    retransmits: int = 0
    results: int = 0
    duplicates_ignored: int = 0
    partial_slots: int = 0
    entries_lost: int = 0        # entries of results that came from fewer than N workers
    overflow_slots: int = 0
    clipped: int = 0             # local values clipped by a non-agreed exponent
    abandoned_slots: int = 0     # bounded mode: results never recovered (zeros applied)
    foreign_ignored: int = 0     # datagrams not from the switch, or not a valid RESULT
    carried_entries: int = 0     # carry mode: own entries left out, sent with a later call
    refetched: int = 0           # results that came re-served (unicast, RETRANSMIT) with
                                 # this worker's DATA in their bitmap: the group's RESULT
                                 # was lost on the way here (not a late contribution)
    local_retries: int = 0       # sends this host's own queue refused (ENOBUFS), sent
                                 # again after LOCAL_RETRY_S (not a loss on the network)
    local_waits: int = 0         # sends that waited for this worker's share of its host's
                                 # queue to drain (a full send buffer: LOCAL_WAITS)
    coalesced_waits: int = 0     # waits before reading RESULTs again, so that one read
                                 # finds several (window.COALESCE_*)
    seconds: float = 0.0

    def add(self, other: "AllreduceStats"):
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)

    def as_dict(self):
        return asdict(self)


@dataclass
class SwitchClient:
    """One worker of one job. ``bind`` must match the job table's member address.
    ``group``: the job's multicast group (``jobtable.loopback_group``), joined on the
    interface of ``bind``; if it cannot be joined, ``group`` is None afterwards and
    ``group_error`` says why (the job must then be installed without multicast)."""
    switch: tuple[str, int]
    job: int
    worker: int
    nworkers: int
    window: int = _D.window        # defaults: ina_fabric.protocol.jobtable.LINK_DEFAULTS
    elements: int = _D.elements
    mode: str = _D.mode
    bind: tuple[str, int] = ("0.0.0.0", 0)
    rto: float = 0.02              # initial retransmission timeout (seconds)

    min_rto: float = 0.01          # floor of the adaptive timeout
    max_inflight_bytes: int = 1 << 20
    deadline: float = _D.deadline  # the switch's per-job deadline (bounded mode), seconds
    connect_timeout: float = 2.0   # no result at all for this long: SwitchUnavailable
    stall_timeout: float = 30.0    # reliable: no progress for this long: AllreduceTimeout
    start_wait: float = 0.25       # reliable: timeout floor until a call's first RESULT
    impairment: object = None      # host.transport.impair.Impairment on the uplink
    #: pacing: the worker's link rate in bit/s (0: none). Datagrams go out no faster than
    #: this, so a window never lands at once in the host's own link queue (issue 18: at
    #: 10 Mbit/s a tbf queue of 20 ms holds 3 jumbo datagrams, and every call's first
    #: window of 8 lost a few of them there, each costing an rto)
    pace_rate: float = 0.0
    #: congestion control (issue 39, docs/congestion.md; the DDP hook takes it from
    #: INA_CONGESTION): "aimd" (a congestion window that halves on loss and grows back
    #: on a clear path), "delay" (the same, also cut when RESULT round trips exceed a
    #: delay target; it starves beside bulk TCP, which keeps the queue full) or "off"
    #: (the fixed call window of before)
    congestion: str = "aimd"
    group: tuple[str, int] | None = None   # multicast group of the job's RESULTs
    engine: str = "auto"           # the call loop: "c" (fastcall), "python", or "auto"
    #: bytes of datagrams this worker may keep in its host's own queue (its send buffer;
    #: docs/congestion.md); None: ``sockbuf.local_queue_bytes``'s rule, TCP's share
    local_queue: int | None = None
    #: "on": the compiled loop sends a run of datagrams of one length as one UDP GSO
    #: send, cut into datagrams by the kernel as late as it can (docs/congestion.md,
    #: "Sending in runs"); "auto": once its calls send at GSO_MIN_RATE or more; "off":
    #: never. The Python loop sends each on its own either way
    gso: str = "auto"
    #: the run's session id: the ``session`` of the job's install (``JobConfig``); every
    #: DATA carries it and only RESULTs with it are taken (0: not known yet, no call)
    session: int = 0
    #: carry mode (bounded modes): a contribution of this worker that a RESULT's bitmap
    #: leaves out is added to its next call of the same size, and partial sums are not
    #: rescaled by N/count; every rank of a job must use the same setting
    carry: bool = False
    seq: int = 0                   # next base sequence number
    #: (session, error name) of the last failed call: calls under that session raise
    #: JobFailed (a new session is a new install of the job, slots afresh)
    failed: tuple | None = None
    #: bounded mode, a result gone for good (AllreduceTooLate): remove the job at the
    #: switch so every rank fails alike; False where the ranks rejoin instead
    #: (``host.ddp.rejoin``: the behind rank takes a peer's replica)
    end_on_too_late: bool = True
    #: the calls' precision (issue 40, docs/precision.md): a width (32, 16, 8), a string
    #: (``Precision.parse``: ``int8:stochastic:hadamard``) or a ``Precision``; a call may
    #: name its own (``allreduce(precision=)``). Every rank of a call must use the same.
    precision: object = None
    #: the seed of stochastic rounding and of the rotation's signs, the same on every
    #: rank (None: the session, which every rank of a run shares)
    seed: int | None = None
    total: AllreduceStats = field(default_factory=AllreduceStats)

    def __post_init__(self):
        self.precision = as_precision(self.precision)
        from ina_fabric.protocol.jobtable import MODES
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: expected one of {', '.join(MODES)}")
        self._residual = {}     # carry mode: call size -> what the last one left out
        #: the session ``seq`` counts in: a client given another session (the job
        #: installed again) starts its sequence at 0 and forgets its failure (issue 43)
        self._run = self.session
        if self.carry and self.mode == "reliable":
            raise ValueError("carry: only in a bounded mode (reliable sums are complete)")
        from .window import CONGESTION
        if self.congestion not in CONGESTION:
            raise ValueError(f"congestion {self.congestion!r}: expected one of "
                             f"{', '.join(CONGESTION)}")
        if self.engine not in ("auto", "c", "python"):
            raise ValueError(f"engine {self.engine!r}: expected auto, c or python")
        impaired = self.impairment is not None and self.impairment.active
        if self.engine == "c" and not fastcall.available():
            raise ValueError(fastcall.WHY_NOT)
        if self.engine == "c" and impaired:
            raise ValueError("an impaired uplink runs the Python loop (engine='python' "
                             "or 'auto')")
        self._use_c = self.engine != "python" and fastcall.available() and not impaired
        if self.engine == "auto" and not fastcall.available():
            fastcall.say_why_not()
        # worker: the id at its switch (its leaf's member index in a tree, docs/fabric.md);
        # nworkers: the job's workers, the whole tree's
        if not (0 <= self.worker < self.nworkers <= MAX_JOB_WORKERS
                and self.worker < MAX_WORKERS):
            raise ValueError(f"worker {self.worker} of {self.nworkers}: need 0 <= w < N <= "
                             f"{MAX_JOB_WORKERS} and w < {MAX_WORKERS} (the id at its switch)")
        if not 1 <= self.elements <= MAX_ELEMENTS:
            raise ValueError(f"elements {self.elements} not in 1..{MAX_ELEMENTS} (a UDP "
                             f"datagram holds at most 65507 bytes)")
        if self.window < 1 or self.window & (self.window - 1):
            raise ValueError(f"window {self.window}: must be a power of two >= 1")
        if self.gso not in GSO:
            raise ValueError(f"gso {self.gso!r}: expected auto, on or off")
        if self.local_queue is not None and self.local_queue < 4096:
            raise ValueError(f"local_queue {self.local_queue}: at least 4096 bytes")
        try:
            self.switch = (socket.gethostbyname(self.switch[0]), int(self.switch[1]))
        except (OSError, ValueError, IndexError) as e:
            raise ValueError(f"bad switch address {self.switch!r}: {e}") from None
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        # RESULTs wait here while this worker computes and the others' slots close
        # without it (bounded modes): seconds of them, not rmem_max's 0.3 s (sockbuf)
        # the send buffer bounds this worker's share of its host's queue (sockbuf:
        # about TCP's), sized again for the rate of each call (_account)
        self._sndbuf = self.local_queue or local_queue_bytes(None)
        self._rate = 0.0          # bytes/s the last call long enough to say sent at
        size_buffers(sock, WORKER_RCVBUF, self._sndbuf)
        sock.bind(self.bind)
        # a datagram this host's own queue drops fails its send (ENOBUFS) instead of
        # vanishing: the loop sends it again shortly, as TCP does on local congestion
        sock.setsockopt(socket.IPPROTO_IP, _IP_RECVERR, 1)
        sock.setblocking(False)
        self.address = sock.getsockname()
        self._usock = sock
        if self.impairment is not None and self.impairment.active:
            from .impair import ImpairedSocket
            sock = ImpairedSocket(sock, self.impairment)
        self.sock = sock
        self.gsock, self.group_error = None, None
        if self.group is not None:
            self._join(tuple(self.group))
        self.sbits = Q.scale_bits(self.nworkers)
        self._stride = HEADER_BYTES + 4 * self.elements
        # the receive buffer (numpy: the dequantize kernel reads it in place) and the ring
        # of window slots DATA packets are built in; both live as long as the client
        self._rx = np.zeros(HEADER_BYTES + 4 * MAX_ELEMENTS + 64, np.uint8)
        self._ring = np.zeros(self.window * self._stride, np.uint8)
        self._rtt = RttEstimator()
        self._poll = select.poll()
        for s in (self._usock, self.gsock):
            if s is not None:
                self._poll.register(s.fileno(), select.POLLIN)
        Q.warm_up()

    def start(self, session: int, seq: int = 0):
        """Begin a run: ``session`` (the job's install), the first ``seq`` (0 after an
        install; a static job's position, ``static_position``), no failure."""
        self.session = self._run = session
        self.seq, self.failed = seq & 0xFFFFFFFF, None
        self._residual.clear()

    def _join(self, group):
        iface = self.address[0]
        g = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            g.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            size_buffers(g, WORKER_RCVBUF)
            g.bind(group)
            g.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                         socket.inet_aton(group[0]) + socket.inet_aton(iface))
            g.setblocking(False)
        except (OSError, ValueError) as e:
            g.close()
            self.group, self.group_error = None, f"cannot join {group[0]}:{group[1]}: {e}"
            return
        self.group, self.gsock = group, g

    # Retransmission timer: TCP's estimator (RFC 6298) with Karn's rule, kept across calls;
    # the window's rules are in ``host.transport.window``.
    def _rto(self):
        return self._rtt.rto(WindowConfig.of(self))

    @property
    def stale_after(self) -> int:
        """A STALE answer whose figure (the job's position) is more than this past a
        call's base says this worker is behind the job: 2 x the job's window (the
        results the switch keeps; a DATA within them is answered with its RESULT), where
        the ranks rejoin (``end_on_too_late`` False, ``host.ddp.rejoin``). Elsewhere never
        (0xFFFFFFFF): a bounded worker late by more than that reads the RESULTs waiting in
        its socket and applies the same sums (``tests/test_bounded_skip.py``)."""
        return 0xFFFFFFFF if self.end_on_too_late else 2 * self.window

    @property
    def giveup(self):
        return self._rtt.giveup(WindowConfig.of(self))

    def close(self):
        self.sock.close()
        if self.gsock is not None:
            self.gsock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------------------
    def allreduce(self, values, average: bool = False, out=None, precision=None):
        """Sum (or average) ``values`` (float32, any shape) over the job's workers.

        ``precision``: this call's (a width, a string or a ``Precision``; default the
        client's ``precision``): the elements' width on the wire, the rounding, and the
        optional Hadamard rotation (docs/precision.md, with each width's error bound).

        ``out``: where the result goes, a C-contiguous float32 array of the same size (it
        may be ``values`` itself: every chunk is read for its DATA packet before its
        RESULT is written); default: a new array. Returns ``(result, stats)``; ``result``
        is ``out`` (or the new array) in the input's shape.

        A call that fails leaves the job's slots half used and, if the ranks' sizes
        differed, their sequence numbers apart: every later call of this client raises
        ``JobFailed`` at once (until the job is installed again under a new session)
        instead of mixing packets of different calls. A bounded-mode worker whose result
        is gone for good (``AllreduceTooLate``) also ends the job at the switch, so every
        other rank's next call raises too instead of carrying on without it (see the
        docs/design.md, "Trust model")."""
        if self.session != self._run:     # a new install: sequence afresh, failure cleared
            self._run, self.seq, self.failed = self.session, 0, None
            self._residual.clear()
        if self.failed is not None and self.failed[0] == self.session:
            raise JobFailed(f"job {self.job} worker {self.worker}: an earlier call failed "
                            f"({self.failed[1]}); the job's slots and sequence numbers no "
                            f"longer agree across ranks: install the job again (a new "
                            f"session) before calling again")
        try:
            prec = self.precision if precision is None else as_precision(precision)
            if prec.rotate:
                return self._rotated(values, average, out, prec)
            return self._allreduce(values, average, out, prec)
        except ValueError:
            raise                     # a bad argument: nothing was sent
        except AllreduceTooLate as e:
            self.failed = (self.session, type(e).__name__)
            if self.end_on_too_late:
                self._end_job()
            raise
        except (OSError, AllreduceInconsistent) as e:
            self.failed = (self.session, type(e).__name__)
            raise

    def _end_job(self):
        """Bounded mode, this worker is too late for good: remove the job (with its
        session, so only this run's install goes) so that every other worker's next call
        fails as this one did, instead of the ranks' replicas going apart. Best effort:
        without the control key, or with the switch gone, the others fail only when they
        too fall behind."""
        from ina_fabric.protocol.control_client import remove_job
        try:
            remove_job(self.switch, self.job, self.session, timeout=0.5)
        except Exception:  # noqa: BLE001 (no key, no answer: nothing more to do here)
            pass

    def _rotated(self, values, average, out, prec):
        """A call with the randomized Hadamard rotation (THC): every rank rotates with the
        same signs (the seed, and the call's first seq as the step), the switch sums the
        rotated vectors, and the inverse rotation of the sum is the sum."""
        from ina_fabric.host.collectives.hadamard import RandomizedHadamard, DEFAULT_BLOCK
        if self.carry:
            raise ValueError("precision: the Hadamard rotation does not combine with carry "
                             "mode (the left-out part would be rotated twice)")
        x = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        if out is not None and not (isinstance(out, np.ndarray) and out.dtype == np.float32
                                    and out.flags.c_contiguous and out.flags.writeable
                                    and out.size == x.size):
            raise ValueError(f"allreduce out=: need a writable C-contiguous float32 "
                             f"array of {x.size} elements")
        rot = RandomizedHadamard(self._seed(), block=DEFAULT_BLOCK)
        step = self.seq
        y, st = self._allreduce(rot.forward(x, step), False, None,
                                Precision(prec.bits, prec.rounding, False))
        res = rot.inverse(y, step, x.size)
        if average:
            res /= self.nworkers
        if out is None:
            return res.reshape(np.shape(values)), st
        out.reshape(-1)[:] = res
        return out, st

    def _seed(self) -> int:
        return (self.session if self.seed is None else int(self.seed)) & ((1 << 64) - 1)

    def _allreduce(self, values, average, out, prec=None):
        prec = Precision() if prec is None else prec
        self._prec = prec
        Q.scale_bits(self.nworkers, prec.bits)     # ValueError: no headroom at this width
        t0 = time.perf_counter()
        x = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        shape = np.shape(values)
        if out is None:
            res = np.empty(shape, np.float32)
        else:
            res = out
            if not (isinstance(out, np.ndarray) and out.dtype == np.float32
                    and out.flags.c_contiguous and out.flags.writeable
                    and out.size == x.size):
                raise ValueError(f"allreduce out=: need a writable C-contiguous float32 "
                                 f"array of {x.size} elements")
        if not 0 < self.session < 1 << 64:
            raise ValueError(f"job {self.job}: the client has no session id (give it the "
                             f"session of the job's install, JobConfig.session)")
        W = self.call_window(-(-x.size // self.elements), prec.bits)
        missed = None
        if self.carry:            # x is a new array from here on (out may be values)
            x, missed = self._carry_in(x), np.zeros(-(-x.size // self.elements), np.uint8)
        if self._use_c:
            st = self._call_c(x, res.reshape(-1), W, missed)
            st.seconds = time.perf_counter() - t0
            st.carried_entries = self._carry_out(x, missed)
            self._account(st, prec.bits)
            if average:
                res /= self.nworkers
            return res, st
        call = AllreduceCall(x, self.job, self.worker, self.nworkers, self.elements,
                             self.seq, W, out=res.reshape(-1), ring=self._ring,
                             session=self.session, missed=missed, bits=prec.bits,
                             stochastic=prec.stochastic, seed=self._seed())
        self.seq = (self.seq + call.P) & 0xFFFFFFFF
        win = SendWindow(call.P, W, WindowConfig.of(self), self._rtt)
        sock, usock, switch, rx = self.sock, self._usock, self.switch, self._rx
        # the unicast socket first, as the compiled loop (an ERROR waiting there is read
        # before the RESULTs waiting in the group's)
        socks = [s for s in (self._usock, self.gsock) if s is not None]
        poll, unpack_from, result_index = self._poll.poll, HEADER_STRUCT.unpack_from, \
            call.result_index
        reliable, stale_after, clock = self.mode == "reliable", self.stale_after, time.monotonic
        h, nbytes = None, 0
        pace = 8.0 / self.pace_rate if self.pace_rate else 0.0
        next_tx = [0.0]

        def send(data):
            if pace:      # as the C loop: no faster than the link (pace_rate)
                t = clock()
                if next_tx[0] > t:
                    time.sleep(next_tx[0] - t)
                    t = next_tx[0]
                next_tx[0] = t + (len(data) + 46) * pace
            _send_once(sock, usock, data, switch, call.stats, win)

        def perform(actions):
            for a in actions:
                kind = type(a)
                if kind is Send:
                    send(call.packet(a.p, a.retransmit, win.low))
                elif kind is Deliver:
                    call.apply(h, rx, a.p)
                elif kind is Abandon:
                    call.abandon(a.p)
                    raise self._too_late(a.p, call.P, W)
                elif kind is Hold:
                    call.hold(a.p, h, rx, nbytes)
                elif a.reason == "unavailable":
                    raise SwitchUnavailable(
                        f"no answer from switch {switch[0]}:{switch[1]} for job "
                        f"{self.job} within {self.connect_timeout}s")
                else:
                    raise self._stalled(win.remaining, call.P)

        perform(win.start(clock()))
        while not win.done:
            useful = False
            for s in socks:
                # drain this socket; a datagram that is no RESULT of this call (or one
                # for the next call, once this one is done) stays counted, not applied
                while not win.done:
                    try:
                        nbytes, src = s.recvfrom_into(rx)
                    except (BlockingIOError, InterruptedError):
                        break
                    except ConnectionRefusedError:
                        _drain_errors(s)
                        continue    # ICMP port unreachable from a switch that is down
                    if src != switch:
                        call.stats.foreign_ignored += 1   # only the switch's RESULTs count
                        continue
                    if nbytes < HEADER_BYTES:
                        continue
                    h = unpack_from(rx)
                    p = result_index(h, nbytes)
                    if p is None:
                        if h[1] == _ERROR and nbytes == HEADER_BYTES:
                            q = call.error_index(h)
                            # a STALE answer ends a reliable call, and a bounded one
                            # whatever this worker has read where the ranks rejoin (as
                            # the compiled loop says why)
                            if (q is not None and (h[H_COUNT] != Refusal.STALE or
                                                   reliable)) or \
                                    call.stale_behind(h, stale_after):
                                raise self._refused(h[H_COUNT], h[H_BITMAP], h[7],
                                                    call.nelem_of(q) if q is not None
                                                    else 0)
                        call.stats.foreign_ignored += 1
                        continue
                    if reliable and h[2] & _PARTIAL:
                        raise AllreduceInconsistent(
                            f"job {self.job} worker {self.worker}: the switch answered a "
                            f"reliable call with a PARTIAL result (was the job installed "
                            f"again as bounded?)")
                    if not h[2] & _PARTIAL and h[H_COUNT] != self.nworkers:
                        raise self._members_differ(h[H_COUNT])
                    actions = win.on_result(p, clock(), bool(h[2] & _CONGESTED))
                    if actions:
                        useful = True
                        perform(actions)
                    else:
                        call.stats.duplicates_ignored += 1
            if useful and not win.done:
                d = win.coalesce()           # read in batches (window.COALESCE_*)
                if d:
                    call.stats.coalesced_waits += 1
                    time.sleep(d)
            if useful or win.done:
                continue
            now = clock()
            acts = win.on_timer(now)
            if acts:
                perform(acts)
                continue
            wake = win.next_wakeup()
            wait = wake - now if wake is not None else win.rto()
            for fd, ev in poll(max(wait, 0.0002) * 1e3):
                if ev & select.POLLERR and fd == usock.fileno():
                    _drain_errors(usock)
        st = call.stats
        st.seconds = time.perf_counter() - t0
        st.carried_entries = self._carry_out(x, missed)
        self._account(st, prec.bits)
        if average:
            res /= self.nworkers
        return res, st

    # -- carry mode: a left-out contribution goes with the next call of that size -----
    def _carry_in(self, x):
        """``x`` plus what the last call of this size left out (a new array)."""
        r = self._residual.get(x.size)
        return x + r if r is not None else x.copy()

    def _account(self, st, bits):
        """A call's statistics into ``total``; the rate it sent at (the bytes it sent
        over its seconds, which count any wait for its peers too, so the rate errs low);
        the send buffer sized for it (``sockbuf.local_queue_bytes``). A call of fewer
        than RATE_MIN_PACKETS datagrams leaves both as they are. The buffer is set again
        only when the rule moves it by a quarter."""
        self.total.add(st)
        if st.packets_sent < RATE_MIN_PACKETS or st.seconds <= 0:
            return
        self._rate = rate = st.packets_sent * (HEADER_BYTES + self.elements * bits // 8) \
            / st.seconds
        if self.local_queue:
            return
        want = local_queue_bytes(rate)
        if abs(want - self._sndbuf) * 4 >= self._sndbuf:
            size_buffers(self._usock, snd=want)
            self._sndbuf = want

    @property
    def sends_in_runs(self) -> bool:
        """Whether the compiled loop's next call sends in runs (``gso``)."""
        return self.gso == "on" or (self.gso == "auto" and self._rate >= GSO_MIN_RATE)

    def _carry_out(self, x, missed):
        """Keep the chunks of ``x`` that the call's RESULTs left this worker out of;
        returns how many entries that is."""
        if missed is None or not missed.any():
            if missed is not None:
                self._residual.pop(x.size, None)
            return 0
        keep = np.repeat(missed.astype(bool), self.elements)[:x.size]
        self._residual[x.size] = np.where(keep, x, np.float32(0))
        return int(keep.sum())

    def _call_c(self, x, out, W, missed=None):
        """One call through the compiled loop (``fastcall``): the same window, packets,
        checks and errors as the Python loop below."""
        E, n = self.elements, x.size
        K = -(-n // E)
        le = np.empty(K, np.int8)
        if K:   # a chunk with inf/NaN proposes NONFINITE: every worker's result is NaN
            fastcall.exponents(x, E, le)
        st = AllreduceStats(calls=1, elements=n)
        base = self.seq
        self.seq = (self.seq + K + W) & 0xFFFFFFFF
        fds = [self._usock.fileno()] + ([self.gsock.fileno()] if self.gsock else [])
        try:
            fastcall.run_call(_LAYOUT, fds, self.switch, x, out, self._ring, le, self.job,
                              self.worker, self.nworkers, E, base, W,
                              WindowConfig.of(self), self._rtt, st, self.session,
                              self.pace_rate, missed, self._prec.bits,
                              self._prec.stochastic, self._seed(), self.stale_after,
                              self.sends_in_runs)
        except fastcall.CallFailed as e:
            if e.code == fastcall.UNAVAILABLE:
                raise SwitchUnavailable(
                    f"no answer from switch {self.switch[0]}:{self.switch[1]} for job "
                    f"{self.job} within {self.connect_timeout}s") from None
            if e.code == fastcall.STALLED:
                raise self._stalled(e.remaining, K + W) from None
            if e.code == fastcall.TOO_LATE:
                raise self._too_late(None, K + W, W) from None
            if e.code == fastcall.REFUSED:
                raise self._refused(e.reason, e.figure, e.seq,
                                    min(E, n - (e.p - W) * E) if e.p >= W else 0) from None
            if e.code == fastcall.MEMBERS_DIFFER:
                raise self._members_differ(e.figure) from None
            if e.code == fastcall.INCONSISTENT:
                raise AllreduceInconsistent(
                    f"job {self.job} worker {self.worker}: the switch answered a "
                    f"reliable call with a PARTIAL result (was the job installed "
                    f"again as bounded?)") from None
            raise OSError(-e.code, f"allreduce socket: {os.strerror(-e.code)}") from None
        return st

    def _members_differ(self, count) -> "AllreduceInconsistent":
        """A complete RESULT (no PARTIAL flag) counts every member of the switch's job:
        ``count`` workers, where this run has ``nworkers``."""
        return AllreduceInconsistent(
            f"job {self.job} worker {self.worker}: the switch's job has {count} member(s) "
            f"and this run {self.nworkers} workers: start as many workers as the job has "
            f"members (--workers), or install the job for {self.nworkers}")

    def _refused(self, reason, figure, seq, nelem) -> Exception:
        """The one-line error for an ERROR of the switch (``fields.Refusal``) answering
        this worker's DATA of ``seq`` (``nelem`` elements). Bounded mode, a seq the job
        has passed is ``AllreduceTooLate`` (this worker fell behind)."""
        who = f"job {self.job} worker {self.worker}"
        at = f"the switch at {self.switch[0]}:{self.switch[1]}"
        try:
            reason = Refusal(reason)
        except ValueError:
            return SwitchRefused(f"{who}: {at} refused its DATA (reason {reason}, unknown "
                                 f"to this client: a newer switch?)", reason, figure)
        if reason == Refusal.UNKNOWN_JOB:
            msg = (f"{at} has no job {self.job} (never installed, removed, or the switch "
                   f"restarted): check the job id (--job / INA_JOB) and that the job is "
                   f"installed")
        elif reason == Refusal.NOT_MEMBER:
            msg = (f"{at} holds job {self.job} with {figure} member(s), and worker "
                   f"{self.worker} at {self.address[0]}:{self.address[1]} is not one of "
                   f"them: start as many workers as the job has members, each bound to "
                   f"the address the job table gives it (--workers, --base-port)")
        elif reason == Refusal.BAD_LENGTH:
            msg = (f"{at} takes {figure} elements in this packet of job {self.job}, and "
                   f"this worker sent {nelem}: the switch and every worker must use the "
                   f"same element count (--elements / INA_ELEMENTS; the job has "
                   f"{figure if nelem > figure else 'at least ' + str(nelem)}) and the "
                   f"same call sizes")
        elif reason == Refusal.BAD_WIDTH:
            from ina_fabric.protocol.fields import sum_width, valid_width
            slot = f"int{sum_width(figure)}" if valid_width(figure) else f"code {figure}"
            mine = getattr(self, "_prec", None)
            msg = (f"{at} opened seq {seq} of job {self.job} at {slot} elements, and this "
                   f"worker sent {'int' + str(mine.bits) if mine else 'another width'}: "
                   f"every rank of a call must use the same precision (INA_PRECISION / "
                   f"--precision / the per-bucket hook)")
        elif reason == Refusal.BAD_SESSION:
            msg = (f"{at} holds job {self.job} under another session (another run "
                   f"installed it, or it was installed again): give this run the job's "
                   f"session (--session / INA_SESSION), or install the job again")
        else:
            msg = (f"{at} has passed seq {seq} of job {self.job} (the job is at seq "
                   f"{figure}): this worker is behind the job (a second run of a static "
                   f"job that did not resume at the switch's position, or a worker that "
                   f"fell more than a window behind)")
            if self.mode != "reliable":
                return AllreduceTooLate(
                    f"{who}: bounded mode, {msg}; a bounded worker may fall at most "
                    f"2 x {self.window} less its call's window datagrams behind the "
                    f"others: the switch keeps 2 x {self.window} results, and a larger "
                    f"job window leaves more room")
        return SwitchRefused(f"{who}: {msg}", reason, figure)

    def _stalled(self, remaining, packets) -> "AllreduceTimeout":
        """The stall error, saying who stalls the job when the switch can tell: the
        workers its oldest open slot still lacks (every stalled rank names the same
        ones), that it no longer holds the job (or holds another run's), or that it
        does not answer at all."""
        msg = (f"job {self.job} worker {self.worker}: no progress for {self.stall_timeout}s "
               f"({remaining} of {packets} packets outstanding)")
        return AllreduceTimeout(msg + self._switch_says(waiting=True))

    def _too_late(self, p, packets, w) -> "AllreduceTooLate":
        what = "a result" if p is None else f"the result of packet {p} of {packets}"
        msg = (f"job {self.job} worker {self.worker}: bounded mode, {what} did not come "
               f"within {self.giveup:g}s and the switch no longer has it (this worker fell "
               f"more than {2 * self.window - w} datagrams behind the others: the switch "
               f"keeps 2 x {self.window} results and this call's window is {w}; a larger "
               f"job window leaves more; or the switch lost the job); the call fails "
               f"instead of applying zeros no other worker applies")
        drops = [d for d in (socket_drops(s) for s in (self._usock, self.gsock)
                             if s is not None) if d]
        if drops:
            msg += (f"; this worker's receive buffer overflowed ({sum(drops)} datagrams "
                    f"dropped by the kernel: RESULTs that came while it was not reading)")
        return AllreduceTooLate(msg + self._switch_says(waiting=False))

    def _switch_says(self, waiting) -> str:
        """What the switch's STATUS tells about this job, as the end of an error."""
        from ina_fabric.protocol.control_client import query_status
        try:
            jobs = query_status(self.switch, timeout=0.5).get("jobs", {})
        except Exception as e:  # noqa: BLE001 (no answer, no key: say so)
            return (f"; the switch at {self.switch[0]}:{self.switch[1]} did not answer a "
                    f"STATUS request ({e})")
        job = jobs.get(str(self.job))
        if job is None:
            return (f"; the switch no longer holds job {self.job} (restarted, the job "
                    f"was removed, or a bounded-mode worker too far behind ended it)")
        if job.get("session") not in (None, f"{self.session:016x}"):
            return (f"; the switch holds job {self.job} under another session (installed "
                    f"again by another run, or restarted and installed again)")
        if waiting and job.get("waiting_for"):
            return (f"; waiting for worker(s) {', '.join(map(str, job['waiting_for']))} "
                    f"(the switch's oldest open slot lacks them)")
        return ""

    def call_window(self, chunks: int, bits: int = 32) -> int:
        """The window of one call: a power of two that divides the job's window (so
        that a slot's result is never overwritten before every worker has it; see the
        docs/design.md), about half the chunk count: fewer header-only packets for small buckets
        at the cost of a few more round trips. It also keeps at most
        ``max_inflight_bytes`` on the wire, so N workers' bursts fit the switch's socket
        buffer instead of overflowing it: counted at the call's element width (``bits``),
        so a narrow call keeps as many bytes in flight as an int32 one, in more packets
        (up to the job's window)."""
        cap = max(1, min(chunks // 2, self.window,
                         self.max_inflight_bytes // (bits // 8 * self.elements)))
        w = 1
        while w * 2 <= cap and self.window % (w * 2) == 0:
            w *= 2
        return w


class AllreduceCall:
    """The data side of one call, without I/O or clock: DATA packet ``p`` (built in ring
    slot ``p % w`` on first use, kept there until its result is in), the RESULT of ``p``
    applied to ``out``, or zeros for an abandoned one. ``SendWindow`` says when; ``stats``
    counts what was done.

    ``out``: the float32 output (default ``np.empty``); every chunk of it is written
    exactly once (a RESULT, or zeros). ``ring``: a uint8 array of at least ``window``
    slots of ``HEADER_BYTES + 4 * elements`` bytes (default: a fresh one). RESULT headers
    come in as ``HEADER_STRUCT.unpack_from`` tuples, their datagrams as uint8 arrays."""

    def __init__(self, x, job, worker, nworkers, elements, base, window, out=None,
                 ring=None, session=0, missed=None, bits=32, stochastic=False, seed=0):
        """``missed``: carry mode (``SwitchClient.carry``), a uint8 array of a flag per
        chunk, set where a RESULT's bitmap leaves this worker out; partial sums are then
        not rescaled by N/count (the left-out contributions come with a later call).
        ``bits``, ``stochastic``, ``seed``: the call's precision (docs/precision.md)."""
        self.bits, self.stochastic, self.seed = bits, bool(stochastic), int(seed)
        self.esize = bits // 8
        self.wbyte = width_byte(bits)
        n, E = x.size, elements
        self.missed = missed
        self.x, self.n, self.E, self.W = x, n, E, window
        self.K = K = (n + E - 1) // E
        self.P = K + window
        self.job, self.worker, self.nworkers, self.base = job, worker, nworkers, base
        self.session = session
        self.sbits = Q.scale_bits(nworkers, bits)
        self.stats = AllreduceStats(calls=1, elements=n)
        self.out = np.empty(n, np.float32) if out is None else out
        self.stride = stride = HEADER_BYTES + 4 * E
        if ring is None or ring.size < window * stride:
            ring = np.zeros(window * stride, np.uint8)
        self.ring, self.ringmv = ring, memoryview(ring)
        self.slot_p = [-1] * window          # which packet each ring slot holds
        le = np.empty(K, np.int8)
        if K:   # a chunk with inf/NaN proposes NONFINITE: every worker's result is NaN
            Q._exponents(x.view(np.uint32), E, le)
        self.local_exp = le.tolist()
        self.shared_exp = [NO_EXPONENT] * K
        self.held = {}      # p -> (header, datagram) of a RESULT in before p was sent

    def _build(self, p, off):
        K, W, E, n = self.K, self.W, self.E, self.n
        nel = 0
        if p >= W:
            j = p - W
            nel = min(E, n - j * E)
            if self.bits == 32 and not self.stochastic:
                self.stats.clipped += Q._pack(self.x, j * E, nel, self.shared_exp[j],
                                              self.sbits, self.ring, off + HEADER_BYTES)
            else:
                self.stats.clipped += Q.pack_width(
                    self.x, j * E, nel, self.shared_exp[j], self.sbits, self.ring,
                    off + HEADER_BYTES, self.bits, self.stochastic,
                    Q.chunk_key(self.seed, self.base + p, self.worker))
        HEADER_STRUCT.pack_into(self.ring, off, VERSION, _DATA,
                                _LAST if p == self.P - 1 else 0,
                                self.local_exp[p] if p < K else NO_EXPONENT, self.job,
                                self.worker, self.wbyte, (self.base + p) & 0xFFFFFFFF, nel,
                                0, 1 << self.worker, self.session)
        return HEADER_BYTES + self.esize * nel

    def packet(self, p, retransmit=False, low=0):
        """The DATA datagram of packet ``p`` (a view of its ring slot, valid until the
        packet ``p + w`` is built), counted as sent. ``low``: no packet below it lacks
        its RESULT (``SendWindow.low``): the DATA's ``count`` carries the ack
        (``ack_of``)."""
        slot = p % self.W
        off = slot * self.stride
        if self.slot_p[slot] != p:
            self.slot_p[slot] = p
            self.ring[off + 2] = 0
            size = self._build(p, off)
        else:
            size = HEADER_BYTES + self.esize * self.nelem_of(p)
        _ACK.pack_into(self.ring, off + _COUNT_OFF, ack_of(p, low))
        st = self.stats
        st.packets_sent += 1
        if retransmit:
            self.ring[off + 2] |= _RETRANSMIT
            st.retransmits += 1
        return self.ringmv[off:off + size]

    def nelem_of(self, p) -> int:
        """Elements packet ``p`` carries (and its RESULT must carry)."""
        return min(self.E, self.n - (p - self.W) * self.E) if p >= self.W else 0

    def stale_behind(self, h, after):
        """Whether ``h`` (a header-only ERROR) is a STALE answer saying this worker is
        behind the job: to a DATA of this call or an earlier one of this worker's session
        (version, job, worker, session checked), its figure (the job's position when the
        switch answered) more than ``after`` past this call's base. An answer from before
        a rejoin (which moved the base to the job's position) is not. The RESULTs the
        worker missed may still wait in its socket: its DATA go on being too late, its
        peers' results leaving it out, until it rejoins."""
        seq, ahead = h[7], (h[H_BITMAP] - self.base) & 0xFFFFFFFF
        ours = ((seq - self.base) & 0xFFFFFFFF) < self.P or \
            ((self.base - seq) & 0xFFFFFFFF) < 1 << 31
        return (h[H_COUNT] == Refusal.STALE and h[0] == VERSION and h[4] == self.job
                and h[5] == self.worker and h[H_SESSION] == self.session and ours
                and after < ahead < 1 << 31)

    def error_index(self, h):
        """The packet index of an ERROR (``h``, a header-only datagram) that answers a
        DATA of this call (version, job, worker, session and seq checked), or None."""
        p = (h[7] - self.base) & 0xFFFFFFFF
        if (h[0] == VERSION and h[4] == self.job and h[5] == self.worker and p < self.P
                and h[H_SESSION] == self.session):
            return p
        return None

    def result_index(self, h, nbytes):
        """The packet index of a RESULT of this call (header ``h``, a ``HEADER_STRUCT``
        tuple, of a datagram ``nbytes`` long), or None for anything else: every field is
        checked before use (type, version, job, session, seq in this call, the element
        count this packet has, the length, the count of contributors, the worker field)."""
        p = (h[7] - self.base) & 0xFFFFFFFF
        if (h[1] == _RESULT and h[0] == VERSION and h[4] == self.job and p < self.P
                and h[8] == self.nelem_of(p) and self.esize * h[8] == nbytes - HEADER_BYTES
                and h[H_WIDTH] == self.wbyte
                and h[H_COUNT] <= self.nworkers and (h[5] == self.worker or h[5] == GROUP_WORKER)
                and h[H_SESSION] == self.session):
            return p
        return None

    def hold(self, p, h, buf, nbytes):
        """Keep the RESULT of ``p`` (a copy) until ``SendWindow`` delivers it."""
        self.held[p] = (h, np.array(buf[:nbytes], np.uint8))

    def apply(self, h, buf, p):
        """The first RESULT of ``p`` (header ``h``, datagram in ``buf``; or the one held)."""
        held = self.held.pop(p, None)
        if held is not None:
            h, buf = held
        st = self.stats
        st.results += 1
        W = self.W
        flags, count, nel = h[2], h[H_COUNT], h[8]
        if p < self.K:
            self.shared_exp[p] = h[3]
        if flags & _OVERFLOW:
            st.overflow_slots += 1
        if flags & _RETRANSMIT and h[H_BITMAP] >> self.worker & 1:
            st.refetched += 1    # re-served, with this worker's DATA in: a lost RESULT
        partial = bool(flags & _PARTIAL) or count < self.nworkers
        if partial:
            st.partial_slots += 1
            st.entries_lost += nel
        if p < W or nel == 0:
            return
        start = (p - W) * self.E
        if count == 0:
            self.out[start:start + nel] = 0.0
            return
        carry = self.missed is not None
        if carry and partial and not h[H_BITMAP] >> self.worker & 1:
            self.missed[p - W] = 1
        Q.dequantize_width_into(buf, HEADER_BYTES, nel, self.shared_exp[p - W], self.sbits,
                                self.out, start,
                                self.nworkers / count if partial and not carry else 1.0,
                                self.bits)

    def abandon(self, p):
        """Bounded mode: the result of ``p`` is gone for good; zeros, identically counted."""
        st = self.stats
        st.abandoned_slots += 1
        if p >= self.W:
            nel = self.nelem_of(p)
            st.entries_lost += nel
            start = (p - self.W) * self.E
            self.out[start:start + nel] = 0.0
        if p < self.K:
            self.shared_exp[p] = NO_EXPONENT  # send zeros: no exponent agreed
