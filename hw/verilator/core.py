"""The INA core running in Verilator, driven from Python through ctypes.

    from ina_fabric.hw.verilator.core import RtlCore, load_job
    core = RtlCore(CoreParams(workers=32, window=16, elements=256, lanes=8, jobs=2))
    load_job(core, job_config, index=0, deadline_cycles=...)
    core.push(datagram, ("10.0.0.1", 20000))     # queued as beats
    core.run()                                   # until the input is taken and the output idle
    core.accepted()   # [cycle of each datagram's first beat]
    core.outputs()    # [((dst_ip, dst_port), bytes, meta)]

Everything per beat happens in C++ (``harness.cpp``): Python only passes datagrams.
"""

import ctypes
import ipaddress
import socket
import time

from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.protocol.regs import (COUNTER_NAMES, GLOBAL_REGS, READ_LATENCY, WRITE_LATENCY,
                                      ID_VALUE, config_writes, counter_addr, job_reg_addr,
                                      parent_writes)

from .build import build_core

__all__ = ["RtlCore", "load_job", "unload_job", "set_deadline", "OutMeta"]

_u64p = ctypes.POINTER(ctypes.c_uint64)

#: cycles to wait after the run's input is taken and the output went quiet before a run
#: ends: longer than the core's worst result start (PIPE_BOUND, 37 idle output cycles,
#: in sim/ina/coverage.py) with room to spare
DRAIN = 64


class OutMeta(ctypes.Structure):
    _fields_ = [("dst_ip", ctypes.c_uint64), ("dst_port", ctypes.c_uint64),
                ("mcast", ctypes.c_uint64), ("length", ctypes.c_uint64),
                ("ip_checksum", ctypes.c_uint64), ("dst_mac", ctypes.c_uint64),
                ("cycle", ctypes.c_uint64), ("_pad", ctypes.c_uint64)]


def _ip(text: str) -> int:
    return int.from_bytes(socket.inet_aton(text), "big")


class RtlCore:
    """One core instance in Verilator (built, or loaded from the cache, on creation)."""

    def __init__(self, params: CoreParams, *, planted_bug=None, log=None, src_ip="127.0.0.1",
                 error_interval=None):
        self.params = params
        t = time.perf_counter()
        self.lib_path = build_core(params, planted_bug=planted_bug, log=log,
                                   error_interval=error_interval)
        self.build_seconds = time.perf_counter() - t
        lib = self._lib = ctypes.CDLL(str(self.lib_path))
        vp, u32, u64, i32 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int
        for name, res, args in (
                ("ina_new", vp, []), ("ina_free", None, [vp]), ("ina_reset", None, [vp, i32]),
                ("ina_write", None, [vp, u32, u32]), ("ina_read", u32, [vp, u32, i32]),
                ("ina_push", None, [vp, ctypes.c_char_p, i32, u32, u32]),
                ("ina_run", u64, [vp, u64, u32]), ("ina_step", u64, [vp, u64]),
                ("ina_cycle", u64, [vp]), ("ina_accepted", i32, [vp, _u64p, i32]),
                ("ina_pending_in", i32, [vp]), ("ina_out_count", i32, [vp]),
                ("ina_pop_out", i32, [vp, ctypes.c_char_p, i32, ctypes.POINTER(OutMeta)]),
                ("ina_stats", None, [vp, _u64p])):
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        self._h = lib.ina_new()
        self._buf = ctypes.create_string_buffer(65536)
        self._meta = OutMeta()
        self._acc = (ctypes.c_uint64 * 4096)()
        lib.ina_reset(self._h, 3)
        ident = self.read(next(r.offset for r in GLOBAL_REGS if r.name == "id"))
        if ident != ID_VALUE:
            raise RuntimeError(f"the core's id register reads 0x{ident:08x}, not "
                               f"0x{ID_VALUE:08x}")
        #: the ``src_ip`` register (the source of the IPv4 header checksum of RESULTs)
        self.src_ip = _ip(src_ip)
        self.write(next(r.offset for r in GLOBAL_REGS if r.name == "src_ip"), self.src_ip)

    def close(self):
        if self._h:
            self._lib.ina_free(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- register bus ----------------------------------------------------------------
    def write(self, addr: int, value: int):
        self._lib.ina_write(self._h, addr, value & 0xFFFFFFFF)

    def read(self, addr: int) -> int:
        return self._lib.ina_read(self._h, addr, READ_LATENCY)

    def counters(self) -> dict:
        """The core's counters (``COUNTER_NAMES``), read over the register bus."""
        self.step(WRITE_LATENCY + 2)     # counters lag their events by a cycle
        return {n: self.read(counter_addr(n)) for n in COUNTER_NAMES}

    # -- packets ---------------------------------------------------------------------
    def push(self, datagram: bytes, source):
        self._lib.ina_push(self._h, datagram, len(datagram), _ip(source[0]), source[1])

    def run(self, max_cycles: int = 1 << 40, drain: int = DRAIN) -> int:
        """Run until the queued input is taken and the output has been idle ``drain``
        cycles; returns the cycles run."""
        return self._lib.ina_run(self._h, max_cycles, drain)

    def step(self, n: int) -> int:
        return self._lib.ina_step(self._h, n)

    @property
    def cycle(self) -> int:
        return self._lib.ina_cycle(self._h)

    def accepted(self) -> list[int]:
        """The cycle of each datagram's first accepted beat since the last call."""
        out = []
        while True:
            n = self._lib.ina_accepted(self._h, self._acc, len(self._acc))
            out += self._acc[:n]
            if n < len(self._acc):
                return out

    def outputs(self) -> list:
        """The output datagrams since the last call: ``[((ip, port), bytes, OutMeta)]``."""
        out = []
        lib, h, buf, meta = self._lib, self._h, self._buf, self._meta
        while True:
            n = lib.ina_pop_out(h, buf, len(buf), ctypes.byref(meta))
            if n < 0:
                return out
            m = OutMeta.from_buffer_copy(meta)
            out.append(((str(ipaddress.IPv4Address(m.dst_ip)), m.dst_port), buf.raw[:n], m))

    def stats(self) -> dict:
        a = (ctypes.c_uint64 * 8)()
        self._lib.ina_stats(self._h, a)
        return dict(zip(("cycles", "in_beats", "in_stall", "out_beats", "out_datagrams",
                         "in_datagrams", "busy_cycles"), a[:7]))


# -- the job-load path (registers today; in-band CONTROL once the core parses it) -------
def load_job(core: RtlCore, cfg, index: int, deadline_cycles: int):
    """Load ``cfg`` (a JobConfig) into entry ``index`` of the core's job table through
    the register bus (``config_writes``, as ``ina hw-config --format regs``), and wait
    until the core has reset the job's slots (``enable`` reads 1). Raises ValueError
    when the job does not fit the core."""
    P = core.params
    writes = config_writes(cfg, index, clock_hz=1.0, window_max=P.window,
                           elements_max=P.elements, workers_max=P.workers,
                           deadline_cycles=deadline_cycles, tree=P.tree, leaf=P.leaf)
    if P.leaf and cfg.parent is not None:
        # the core's one parent switch (its MAC: the engine sends by IP and port)
        writes = parent_writes(cfg.parent, "00:00:00:00:00:00") + writes
    for addr, value in writes:
        core.write(addr, value)
    core.step(WRITE_LATENCY)
    for _ in range(64 * P.window):
        if core.read(job_reg_addr(index, "enable")):
            return
    raise RuntimeError(f"job {cfg.job}: the core's enable for entry {index} still reads 0")


def unload_job(core: RtlCore, index: int):
    """Disable entry ``index`` (its packets then count as unknown jobs)."""
    core.write(job_reg_addr(index, "enable"), 0)
    core.write(job_reg_addr(index, "job_id"), 0)
    core.step(WRITE_LATENCY)


def set_deadline(core: RtlCore, index: int, deadline_cycles: int):
    """A live deadline update: the register alone, the slots are kept."""
    core.write(job_reg_addr(index, "deadline"), deadline_cycles)
    core.step(WRITE_LATENCY)
