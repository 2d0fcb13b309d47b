"""The switch with its DATA path in the real gateware: ``RtlSwitchModel``.

``ina switch --engine rtl`` serves the same UDP interface as the software switch, but
every datagram other than CONTROL and STATUS_REQ goes as beats into the INA core
(``hw/ina``), simulated by Verilator (``ina_fabric.hw.verilator``), and what the core
sends goes back out as UDP to the destination it names. Beside it runs the reference
model (``model.py``) on the very same datagrams at the very same times: a live
scoreboard. Every output datagram (bytes and destination, and the length and IPv4
checksum the core gives the front end) and every counter must agree; the first
disagreement raises :class:`RtlDisagreement`, which stops the server with the datagram,
what each side did and the counters.

Control plane: CONTROL and STATUS_REQ go through the model's rules (authentication,
admission, install / live update / removal) exactly as in the software switch; a job
that is installed, updated or removed there is loaded into the core by :func:`load_job`
(``ina_fabric.hw.verilator.core``: the register path of ``ina hw-config``; it is the
one function to change once the core parses CONTROL in band) and into the scoreboard.

Time: the core's time is its cycle count. The scoreboard model runs on the same clock,
in seconds of ``CYCLES_PER_SECOND`` (2^17) cycles each, a power of two, so a cycle count
is exact in a float and the model's deadline compares are exactly the core's. In
reliable mode the core runs only when there is work (nothing depends on time). With a
bounded job installed, the core's clock also follows the wall clock while a bounded
slot is open (idle cycles are simulated up to the wall time: at least
``CYCLES_PER_SECOND`` cycles per second, a 131 kHz core, below what Verilator simulates
here, so it keeps up), so its deadlines are wall-clock deadlines, as the software
switch's are; with no slot open nothing depends on the clock and it is re-anchored
instead of simulated.
"""

from collections import deque
import dataclasses
import json
import os
import struct
import time

from ina_fabric.protocol.fields import (HEADER_BYTES, VERSION, MsgType, field_offsets,
                                        ERROR_INTERVAL)
from .model import SwitchModel
from ina_fabric.protocol.jobtable import GATEWARE_MODES

__all__ = ["RtlSwitchModel", "RtlDisagreement", "RTL_PARAMS", "rtl_params",
           "CYCLES_PER_SECOND", "available", "why_not"]

#: the core the RTL engine simulates (``INA_RTL_PARAMS``, JSON of ``CoreParams``
#: fields, overrides it): 8 lanes (one 1,044-byte datagram in 33 cycles), the Ethernet
#: defaults' 256 elements per packet, a window of 16 (W = 16, E = 256 fits two jobs on
#: the ECP5-45F), up to 32 workers, two jobs
RTL_PARAMS = dict(workers=32, window=16, elements=256, lanes=8, jobs=2)

#: cycles per second of the core's clock as the model sees it, and at least as the wall
#: clock sees it with a bounded job (a power of two: cycle counts are exact as seconds)
CYCLES_PER_SECOND = 1 << 17
#: the core's cycles between two ERRORs to one source bucket (``fields.ERROR_INTERVAL``
#: at that clock; the scoreboard's model gets the same, as seconds: exact in a float).
#: Like deadlines, it runs on the core's clock, which in reliable mode runs only while
#: there is work: a source is answered again after that much *simulated* time.
ERROR_CYCLES = round(ERROR_INTERVAL * CYCLES_PER_SECOND)

_OFF = field_offsets()
_CONTROL_PLANE = (int(MsgType.CONTROL), int(MsgType.STATUS_REQ))


def rtl_params():
    """The core to simulate: ``RTL_PARAMS``, with ``$INA_RTL_PARAMS`` (JSON) over it.
    Raises ValueError (with the reason) for a bad ``$INA_RTL_PARAMS``."""
    from ina_fabric.hw.ina.params import CoreParams
    text = os.environ.get("INA_RTL_PARAMS") or "{}"
    try:
        return CoreParams(**{**RTL_PARAMS, **json.loads(text)})
    except (ValueError, TypeError) as e:
        raise ValueError(f"INA_RTL_PARAMS={text!r}: {e}") from None


def why_not() -> str | None:
    """Why the RTL engine cannot run here, or None."""
    try:
        from ina_fabric.hw.verilator.build import why_not as vwhy
        import amaranth  # noqa: F401
    except ImportError as e:
        return f"the gateware packages are not installed ({e}): pip install '.[hw]'"
    return vwhy()


def available() -> bool:
    return why_not() is None


class RtlDisagreement(RuntimeError):
    """The core and the reference model disagree; the message says where and how."""


def _hex(b: bytes, n: int = 48) -> str:
    return b[:n].hex() + ("..." if len(b) > n else "") + f" ({len(b)} B)"


def _key(dest, data: bytes):
    """What pairs an output of the core with the model's: destination, job, seq (and
    "ERROR" for an ERROR: the core sends those on their own path, in order among
    themselves, not among the RESULTs)."""
    if len(data) < HEADER_BYTES:
        return (dest, None, None)
    job = int.from_bytes(data[_OFF["job"]:_OFF["job"] + 2], "big")
    seq = int.from_bytes(data[_OFF["seq"]:_OFF["seq"] + 4], "big")
    return (dest, job, seq) + (("ERROR",) if data[1] == MsgType.ERROR else ())


class RtlSwitchModel(SwitchModel):
    """``SwitchModel``'s interface with the DATA path in the simulated core and the
    model beside it as the scoreboard (same constructor, plus ``params``, ``log`` and
    ``planted_bug`` for the tests)."""

    def __init__(self, jobs=(), *, params=None, log=None, planted_bug=None, **kw):
        kw.setdefault("modes", GATEWARE_MODES)
        from ina_fabric.hw.verilator.core import RtlCore
        self.params = params or rtl_params()
        self.core = RtlCore(self.params, planted_bug=planted_bug, log=log,
                            error_interval=ERROR_CYCLES)
        # the element widths the core sums (CoreParams.widths): the model drops the others
        # as malformed, as the core does
        kw.setdefault("widths", self.params.widths)
        #: the scoreboard: the reference model fed exactly what the core is fed (the
        #: core answers refused DATA as the model does: issue 43)
        self.ref = SwitchModel(modes=GATEWARE_MODES,
                               error_interval=ERROR_CYCLES / CYCLES_PER_SECOND,
                               widths=self.params.widths)
        self._index = {}            # job id -> entry of the core's job table
        self._deadline_cycles = {}  # job id -> its deadline in cycles
        self._expected = {}         # key -> deque of (cycle, dest, bytes): model's, unmatched
        self._actual = {}           # key -> deque of (cycle, dest, bytes, meta): core's
        self.sim_seconds = 0.0      # wall time spent simulating
        self.runs = 0
        self.disagreements = 0
        self._t0 = None             # wall time of cycle 0 (bounded jobs: clock follows wall)
        P = self.params
        #: how long the core may take to send what the model sent, in cycles: the
        #: scanner's sweep of every record, a full packet, the pipeline (the coverage
        #: bench's bound, sim/ina/coverage.py) and the run's drain, with room to spare
        self.bound = 2 * P.records + 2 * P.ideal_beats + 256
        super().__init__(jobs, **kw)

    # -- the job table: the model's rules, mirrored into the core and the scoreboard --
    def _cycles(self, seconds: float) -> int:
        return max(1, round(seconds * CYCLES_PER_SECOND))

    def _ref_cfg(self, cfg):
        """The job as the scoreboard holds it: its deadline in whole cycles."""
        return dataclasses.replace(cfg, deadline=self._cycles(cfg.deadline) / CYCLES_PER_SECOND)

    def add_job(self, cfg, now=None):
        from ina_fabric.protocol.jobtable import ConfigError
        from ina_fabric.hw.verilator.core import load_job
        P = self.params
        if cfg.window > P.window or cfg.window & (cfg.window - 1):
            raise ConfigError(f"job {cfg.job}: window {cfg.window} does not fit the core "
                              f"(a power of two <= {P.window})")
        if cfg.elements > P.elements:
            raise ConfigError(f"job {cfg.job}: {cfg.elements} elements per packet, the "
                              f"core takes at most {P.elements}")
        if cfg.n > P.workers:
            raise ConfigError(f"job {cfg.job}: {cfg.n} workers, the core takes at most "
                              f"{P.workers}")
        if cfg.mode not in self.modes:
            raise ConfigError(f"job {cfg.job}: mode {cfg.mode!r} runs on the software "
                              f"switches only (the gateware has {', '.join(self.modes)})")
        if cfg.parent is not None and not P.leaf:
            raise ConfigError(f"job {cfg.job}: a leaf of a tree of switches (docs/fabric.md) "
                              f"needs the core built with the leaf option (INA_RTL_PARAMS="
                              f"'{{\"tree\": true, \"leaf\": true}}'); this core is not a leaf")
        if cfg.parent is not None and any(
                js.cfg.parent not in (None, cfg.parent) for j, js in self.jobs.items()
                if j != cfg.job):
            raise ConfigError(f"job {cfg.job}: parent {cfg.parent[0]}:{cfg.parent[1]}, but "
                              f"the core's jobs have another (the gateware has one parent "
                              f"switch)")
        if cfg.children and not P.tree:
            raise ConfigError(f"job {cfg.job}: a spine of a tree of switches needs the core "
                              f"built with the tree option (INA_RTL_PARAMS='{{\"tree\": "
                              f"true}}')")
        index = self._index.get(cfg.job)
        if index is None:
            free = sorted(set(range(P.jobs)) - set(self._index.values()))
            if not free:
                raise ConfigError(f"job {cfg.job}: the core's job table is full "
                                  f"({P.jobs} jobs)")
            index = free[0]
        super().add_job(cfg, now)     # the model's admission rules (and job ids' sessions)
        self._forget(cfg.job)         # the job's slots start afresh on both sides
        self._index[cfg.job] = index
        self._deadline_cycles[cfg.job] = self._cycles(cfg.deadline)
        self.ref.add_job(self._ref_cfg(cfg))
        load_job(self.core, cfg, index, self._deadline_cycles[cfg.job])
        self._sync_clock_start()

    def remove_job(self, job: int, session: int = 0):
        from ina_fabric.hw.verilator.core import unload_job
        super().remove_job(job, session)
        index = self._index.pop(job, None)
        if index is not None:
            self._forget(job)
            self.ref.remove_job(job)
            unload_job(self.core, index)

    def _retune(self, js, cfg):
        from ina_fabric.protocol.regs import job_reg_addr
        from ina_fabric.hw.verilator.core import set_deadline
        from ina_fabric.protocol.jobtable import ConfigError
        if cfg.mode not in self.modes:
            raise ConfigError(f"job {cfg.job}: mode {cfg.mode!r} runs on the software "
                              f"switches only (the gateware has {', '.join(self.modes)})")
        super()._retune(js, cfg)
        index = self._index[cfg.job]
        self._deadline_cycles[cfg.job] = self._cycles(cfg.deadline)
        self.core.write(job_reg_addr(index, "bounded"), int(cfg.mode == "bounded"))
        set_deadline(self.core, index, self._deadline_cycles[cfg.job])
        self.ref._retune(self.ref.jobs[cfg.job], self._ref_cfg(cfg))
        self._sync_clock_start()

    def start_at(self, job: int, seq: int):
        """Refused: the core's job initializer sets every record to the virtual tags
        before seq 0, and no register sets them otherwise (the cocotb benches preload
        tags through the simulator instead). Moving only the model would make the
        scoreboard disagree with the core."""
        from ina_fabric.protocol.jobtable import ConfigError
        raise ConfigError(f"job {job}: the RTL engine starts every job at seq 0 (the core "
                          f"has no register to preload slot tags)")

    def _sync_clock_start(self):
        if self._bounded() and self._t0 is None:
            self._t0 = time.monotonic() - self.core.cycle / CYCLES_PER_SECOND

    def _bounded(self) -> bool:
        return any(js.cfg.mode == "bounded" for js in self.jobs.values())

    # -- datagrams ---------------------------------------------------------------------
    @staticmethod
    def _control_plane(d: bytes) -> bool:
        return len(d) >= HEADER_BYTES and d[0] == VERSION and d[1] in _CONTROL_PLANE

    def process(self, datagram, source, now: float):
        return self.process_batch([(datagram, tuple(source))], now)

    def process_batch(self, items, now: float):
        """Datagrams ``[(bytes, (ip, port))]`` that arrived by wall time ``now``, in
        order: the control plane's through the model, the rest through the core (back
        to back, as the network would deliver them) and the scoreboard. Returns the
        datagrams to send, the core's, ``[(destination, bytes)]``."""
        out, run = [], []
        for d, src in items:
            if self._control_plane(d):
                out += self._run(run, now)
                run = []
                out += self._receive(d, src, now)
            else:
                run.append((d, src))
        return out + self._run(run, now)

    def tick(self, now: float):
        """Deadlines: with a bounded job, the core's clock catches up with the wall clock
        (the scanner fires what fell due)."""
        if not self._bounded():
            return []
        return self._run([], now)

    def next_deadline(self):
        """Wall time of the scoreboard's next deadline (the core fires it then)."""
        nd = self.ref.next_deadline()
        if nd is None or self._t0 is None:
            return None
        return self._t0 + nd + self.bound / CYCLES_PER_SECOND

    def _run(self, items, now):
        core, ref, R = self.core, self.ref, CYCLES_PER_SECOND
        if not items and not self._bounded():
            return []
        t = time.perf_counter()
        if self._t0 is not None and self._bounded():
            target = int((now - self._t0) * R)
            if target > core.cycle:
                if ref.next_deadline() is None:   # nothing open: nothing to simulate
                    self._t0 = now - core.cycle / R
                else:                             # the clock follows the wall clock
                    core.step(target - core.cycle)
        for d, src in items:
            core.push(d, src)
        core.run()
        accepted = core.accepted()
        actual = core.outputs()
        self.sim_seconds += time.perf_counter() - t
        self.runs += 1
        if len(accepted) != len(items):
            self._fail(f"the core took {len(accepted)} of {len(items)} datagrams")
        for (d, src), cyc in zip(items, accepted):
            for dest, data in ref.process(d, src, cyc / R):
                self._expected.setdefault(_key(dest, data), deque()).append((cyc, dest, data))
        for dest, data in ref.tick(core.cycle / R):
            self._expected.setdefault(_key(dest, data), deque()).append(
                (core.cycle, dest, data))
        for dest, data, meta in actual:
            self._check_meta(dest, data, meta)
            self._actual.setdefault(_key(dest, data), deque()).append(
                (meta.cycle, dest, data, meta))
        self._match()
        if not self._expected:    # (a deadline the model fired, the core's scanner soon)
            self._check_counters()
        return [(dest, data) for dest, data, _ in actual]

    def _check_meta(self, dest, data, meta):
        """What the core hands the L2/L3 front end with the datagram: its length, the
        IPv4 header checksum, the destination MAC (the member's, or the group's
        01:00:5e address)."""
        from ina_fabric.hw.ina.replicator import ipv4_header
        ip = int.from_bytes(bytes(int(x) for x in dest[0].split(".")), "big")
        if meta.mcast:
            mac = 0x01005E000000 | (ip & 0x7FFFFF)
        elif data[1] == MsgType.ERROR:
            mac = 0     # the DATA's frame source (the harness's frames carry none)
        else:
            job = self.ref.jobs.get(_key(dest, data)[1])
            macs = [m.mac for m in job.cfg.members if m.addr == dest] if job else []
            mac = int(macs[0].replace(":", ""), 16) if macs else None
        if mac is not None and meta.dst_mac != mac:
            self._fail(f"output to {dest}: destination MAC {meta.dst_mac:012x}, expected "
                       f"{mac:012x}")
        if meta.length != len(data):
            self._fail(f"output to {dest}: length field {meta.length} but "
                       f"{len(data)} bytes: {_hex(data)}")
        src = self.core.src_ip
        want = struct.unpack(">H", ipv4_header(src, ip, len(data))[10:12])[0]
        if meta.ip_checksum != want:
            self._fail(f"output to {dest}: IPv4 checksum 0x{meta.ip_checksum:04x}, "
                       f"expected 0x{want:04x}")

    def _match(self):
        """Pair the core's outputs with the model's, per destination and slot, in order;
        fail at the first that differ, or that one side sent and the other did not
        within ``bound`` cycles."""
        exp, act = self._expected, self._actual
        for key in list(act):
            qa, qe = act[key], exp.get(key)
            while qa and qe:
                ca, _, da, _ = qa[0]
                ce, _, de = qe[0]
                if da != de:
                    self._fail(f"output to {key[0]} (job {key[1]}, seq {key[2]}) differs:\n"
                               f"  core  (cycle {ca}): {_hex(da, 64)}\n"
                               f"  model (cycle {ce}): {_hex(de, 64)}" + _diff(da, de))
                qa.popleft()
                qe.popleft()
            if qe is not None and not qe:
                del exp[key]
            if not qa:
                del act[key]
        now = self.core.cycle
        for key, qa in act.items():
            # the model has ticked to now: nothing the core sends may still be to come
            ca, _, da, _ = qa[0]
            self._fail(f"the core sent to {key[0]} (job {key[1]}, seq {key[2]}) at cycle "
                       f"{ca} what the model did not: {_hex(da, 64)}")
        for key, qe in exp.items():
            ce, _, de = qe[0]
            # reliable: a result starts within the run's drain of what triggered it;
            # bounded: the scanner may fire a deadline the model fired up to ``bound``
            # cycles later
            if now - ce > self.bound or not self._bounded():
                self._fail(f"the core did not send to {key[0]} (job {key[1]}, seq "
                           f"{key[2]}) what the model sent at cycle {ce} "
                           f"({now - ce} cycles ago): {_hex(de, 64)}")

    def _check_counters(self):
        """The core's counters equal the model's (every name the core has); checked
        after every run in which the core has sent all the model sent."""
        hw = self.core.counters()
        ref = self.ref.counters
        bad = {n: (v, ref[n]) for n, v in hw.items()
               if n != "stream_errors" and v != ref[n]}
        if hw["stream_errors"]:
            bad["stream_errors"] = (hw["stream_errors"], 0)
        if bad:
            self._fail("counters differ (core, model): " + ", ".join(
                f"{n} {a} != {b}" for n, (a, b) in sorted(bad.items())))

    def _forget(self, job: int):
        """Drop what the scoreboard still waits for of ``job`` (installed anew or
        removed: its slots start afresh on both sides)."""
        for q in (self._expected, self._actual):
            for key in [k for k in q if k[1] == job]:
                del q[key]

    def _fail(self, why):
        self.disagreements += 1
        c = self.core.stats()
        raise RtlDisagreement(f"RTL scoreboard: disagreement at cycle {c['cycles']} "
                              f"(after {c['in_datagrams']} datagrams in, "
                              f"{c['out_datagrams']} out): {why}")

    # -- status: the model's counters, the core's figures ---------------------------
    @property
    def counters(self):
        c = self._counts.copy()
        c.update(self.ref.counters)
        return c

    def _job_status(self, js):
        st = self.ref._job_status(self.ref.jobs[js.cfg.job])
        st["deadline_ms"] = js.cfg.deadline * 1e3
        st["core_entry"] = self._index[js.cfg.job]
        return st

    def rtl_stats(self) -> dict:
        """The core's figures: cycles, datagrams, beats, stalls, cycles per packet (and
        the ideal: its beats), simulated cycles per wall second, disagreements."""
        s = self.core.stats()
        n = max(1, s["in_datagrams"])
        return {"params": dataclasses.asdict(self.params), "cycles": s["cycles"],
                "datagrams_in": s["in_datagrams"], "datagrams_out": s["out_datagrams"],
                "beats_in": s["in_beats"], "stall_cycles": s["in_stall"],
                "cycles_per_packet": round((s["in_beats"] + s["in_stall"]) / n, 3),
                "ideal_cycles_per_packet": round(s["in_beats"] / n, 3),
                "sim_seconds": round(self.sim_seconds, 3),
                "cycles_per_second": round(s["cycles"] / self.sim_seconds)
                if self.sim_seconds else None,
                "disagreements": self.disagreements,
                "counters": self.core.counters()}

    def status(self) -> dict:
        return {**super().status(), "rtl": self.rtl_stats()}

    def status_datagram(self, start: int = 0, budget: int = 65507) -> bytes:
        rtl = {k: v for k, v in self.rtl_stats().items() if k != "params"}
        rtl["counters"] = {k: v for k, v in rtl["counters"].items() if v}   # (room)
        extra = len(json.dumps({"rtl": rtl})) + 2
        page = super().status_datagram(start, budget - extra)
        doc = json.loads(page[HEADER_BYTES:])
        doc["rtl"] = rtl
        return self._status_bytes(doc)

    def close(self):
        self.core.close()


def _diff(a: bytes, b: bytes) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"\n  first difference at byte {i}"
    return f"\n  lengths {len(a)} and {len(b)}"
