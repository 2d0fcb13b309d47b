"""The Versa board's datapath in Verilator, driven with Ethernet frames through ctypes.

    from ina_fabric.hw.verilator.board import BoardSim, versa_board
    sim = BoardSim(versa_board(ip="198.18.41.2", worker_net="198.18.41.0/24", key=key))
    sim.push(0, frame)        # a frame as a TAP gives it (no FCS) into port 0
    sim.run(10_000)           # sync (125 MHz) cycles
    sim.pop(0)                # a frame port 0 sent, or None
    sim.serve([tap_fd, -1], seconds=0.2)   # the TAP loop, in C++ (the GIL released)

Everything behind the RGMII pads of ``hw/boards/ecp5_rgmii.Ecp5RgmiiTop``
(``InaDatapath``: both ports' MAC, ARP/IPv4/UDP/ICMP, the in-band control plane with
its HMAC key, the INA core, the replicator, the config ROM), with the board's clocks at
their ratios (``board_harness.cpp`` says how). The core's size, clocks and addresses
come from ``constraints/versa_ecp5.toml`` as the bitstream's do (``hw.build.
board_config``); the IP, worker subnet and key may be overridden (a lab's addresses).
Builds are cached as the core's are (``build.cache_root()``), keyed by the Verilog (so
by the key and addresses too), the harness and the Verilator version.
"""

import ctypes
import dataclasses
import fcntl
import functools
import hashlib
import pathlib
import shutil
import time

from ina_fabric.paths import resource

from .build import VERILATOR, VerilatorMissing, _run, _verilator_root, cache_root, \
    verilator_version, why_not

__all__ = ["BoardSim", "versa_board", "build_board", "SYNC_HZ", "CORE_HZ"]

#: the Versa's clocks (constraints/versa_ecp5.toml [clocks]); the harness's tick plan
#: (5 sync cycles to 3 core cycles) is these two
SYNC_HZ = 125e6
CORE_HZ = 75e6

_u32p = ctypes.POINTER(ctypes.c_uint32)
_u64p = ctypes.POINTER(ctypes.c_uint64)

STAT_NAMES = ("ticks", "sync_cycles", "core_cycles") + tuple(
    f"p{p}_{n}" for p in (0, 1) for n in ("rx_frames", "tx_frames", "tx_bad_fcs", "tx_er",
                                          "tx_undelivered", "rx_dropped")) + ("sim_ns",)


def versa_board(*, ip=None, worker_net=None, mac=None, key=None):
    """The Versa's BoardConfig (constraints/versa_ecp5.toml) with the control key and,
    where given, another IP, worker subnet or MAC."""
    from ina_fabric.hw.build import board_config
    cfg, _, c = board_config("versa_ecp5", control_key=key)
    assert c["clocks"]["sync_mhz"] * 1e6 == SYNC_HZ and c["clocks"]["core_mhz"] * 1e6 == CORE_HZ, \
        "the harness's clock plan is the Versa's 125/75 MHz"
    over = {k: v for k, v in (("ip", ip), ("worker_net", worker_net), ("mac", mac)) if v}
    # the answer path on, as host/switch/board.py's board_params says why
    over["params"] = dataclasses.replace(cfg.params, answers=True)
    return dataclasses.replace(cfg, **over)


@functools.lru_cache(maxsize=4)
def _verilog(board) -> str:
    from amaranth.back import verilog
    from ina_fabric.hw.boards.datapath import InaDatapath
    return verilog.convert(InaDatapath(board), name="ina_board", emit_src=False)


def _canonical(vtext: str) -> str:
    """The Verilog for the cache key, with what differs from one process to the next
    taken out: Amaranth orders a module's ports (and some declarations) by set iteration,
    which string hashing randomizes per process. Its lines sorted, and each module's port
    list sorted: the same design gives the same key in every process."""
    lines = []
    for line in vtext.splitlines():
        if line.startswith("module ") and "(" in line:
            head, _, ports = line.partition("(")
            line = head + "(" + ",".join(sorted(p.strip() for p in ports.rstrip(");").split(",")))
        lines.append(line)
    return "\n".join(sorted(lines))


def build_board(board, *, log=None, jobs=2) -> pathlib.Path:
    """The shared library of ``board`` (a BoardConfig), built unless cached (a build
    takes several minutes: the whole design with the SHA-256 core)."""
    why = why_not()
    if why:
        raise VerilatorMissing(why)
    harness = resource("ina_fabric.hw.verilator", "board_harness.cpp").read_text()
    vtext = _verilog(board)
    version = verilator_version()
    flags = [VERILATOR, "--cc", "ina_board.v", "--top-module", "ina_board", "-Mdir", "obj",
             "-O3", "--x-assign", "fast", "--x-initial", "fast", "--noassert",
             "-Wno-fatal", "-Wno-lint", "-Wno-style", "--build", "-CFLAGS", "-fPIC",
             # Verilator's make compiles the model at -Os (OPT_FAST comes after CFLAGS)
             "-MAKEFLAGS", "OPT_FAST=-O2", "-MAKEFLAGS", "OPT_GLOBAL=-O2"]
    cmd = flags + ["-j", str(jobs)]
    key = hashlib.sha256("\0".join(["board", _canonical(vtext), harness, version, *flags])
                         .encode()).hexdigest()[:16]
    out = cache_root() / f"board-{key}"
    lib = out / "libina_board.so"
    if lib.exists():
        return lib
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.exists():
            return lib
        if log:
            log(f"building the board's datapath with {version} into {out} (once; several "
                f"minutes)")
        (out / "ina_board.v").write_text(vtext)
        (out / "board_harness.cpp").write_text(harness)
        obj = out / "obj"
        shutil.rmtree(obj, ignore_errors=True)
        _run(cmd, out)
        inc = pathlib.Path(_verilator_root()) / "include"
        tmp = out / "libina_board.so.tmp"
        _run(["g++", "-shared", "-fPIC", "-O2", "-std=c++17", f"-I{obj}", f"-I{inc}",
              f"-I{inc / 'vltstd'}", "board_harness.cpp", str(obj / "Vina_board__ALL.a"),
              str(inc / "verilated.cpp"), str(inc / "verilated_threads.cpp"),
              "-o", str(tmp), "-pthread"], out)
        tmp.rename(lib)
    return lib


class BoardSim:
    """One simulated board (built, or loaded from the cache, on creation), reset and
    with its config ROM replayed (``cfg_done``)."""

    def __init__(self, board, *, log=None):
        from ina_fabric.hw.eth.port import PORT_COUNTERS
        assert len(PORT_COUNTERS) == 24, "board_harness.cpp reads 24 counters per port"
        self.board = board
        t = time.perf_counter()
        self.lib_path = build_board(board, log=log)
        self.build_seconds = time.perf_counter() - t
        lib = self._lib = ctypes.CDLL(str(self.lib_path))
        vp, u32, u64, i32 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int
        for name, res, args in (
                ("board_new", vp, []), ("board_free", None, [vp]),
                ("board_reset", None, [vp, i32]), ("board_cfg_done", i32, [vp]),
                ("board_run", u64, [vp, u64]),
                ("board_push", i32, [vp, i32, ctypes.c_char_p, i32]),
                ("board_pop", i32, [vp, i32, ctypes.c_char_p, i32]),
                ("board_read_core", u32, [vp, u32]),
                ("board_port_counters", None, [vp, i32, _u32p]),
                ("board_stats", None, [vp, _u64p]),
                ("board_serve", u64, [vp, ctypes.POINTER(ctypes.c_int), ctypes.c_double,
                                      u64, u64])):
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        self._h = lib.board_new()
        self._buf = ctypes.create_string_buffer(65536)
        lib.board_reset(self._h, 16)
        for _ in range(1000):
            if lib.board_cfg_done(self._h):
                break
            lib.board_run(self._h, 1000)
        else:
            raise RuntimeError("the board's config ROM did not finish (cfg_done low)")
        from ina_fabric.protocol.regs import GLOBAL_REGS, ID_VALUE
        ident = self.read_core(next(r.offset for r in GLOBAL_REGS if r.name == "id"))
        if ident != ID_VALUE:
            raise RuntimeError(f"the board's core id reads 0x{ident:08x}, not 0x{ID_VALUE:08x}")

    def close(self):
        if self._h:
            self._lib.board_free(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def push(self, port: int, frame: bytes):
        if self._lib.board_push(self._h, port, frame, len(frame)) < 0:
            raise ValueError(f"not an Ethernet frame for the board ({len(frame)} bytes)")

    def pop(self, port: int):
        n = self._lib.board_pop(self._h, port, self._buf, len(self._buf))
        return None if n < 0 else self._buf.raw[:n]

    def run(self, sync_cycles: int) -> int:
        return self._lib.board_run(self._h, sync_cycles)

    def serve(self, fds, seconds: float, idle_tail: int, chunk: int = 64) -> int:
        arr = (ctypes.c_int * 2)(*fds)
        return self._lib.board_serve(self._h, arr, seconds, idle_tail, chunk)

    def read_core(self, addr: int) -> int:
        return self._lib.board_read_core(self._h, addr)

    def core_counters(self) -> dict:
        from ina_fabric.protocol.regs import COUNTER_NAMES, counter_addr
        return {n: self.read_core(counter_addr(n)) for n in COUNTER_NAMES}

    def port_counters(self, port: int) -> dict:
        from ina_fabric.hw.eth.port import PORT_COUNTERS
        a = (ctypes.c_uint32 * 24)()
        self._lib.board_port_counters(self._h, port, a)
        return dict(zip(PORT_COUNTERS, a))

    def stats(self) -> dict:
        a = (ctypes.c_uint64 * 16)()
        self._lib.board_stats(self._h, a)
        return dict(zip(STAT_NAMES, a))
