"""Bench of :class:`~ina_fabric.hw.ina.lanes.LaneCodec` (combinational): random lane words
at random widths of the format, random elements past the packet's end, accumulators
holding sums of up to ``workers - 1`` contributions with junk in their gap bits; the
addend, the sum and the packed word against the Python twins, and the sums and the
saturated elements against exact integer arithmetic."""

import random

import cocotb
from cocotb.triggers import Timer

from ina_fabric.hw.ina.lanes import (LaneFormat, Width, acc_values_py, add_py, elements_py,
                                     pack_py, unpack_py, word_py)
from ina_fabric.sim.bench import bench_params


@cocotb.test()
async def test_lane_codec(dut):
    p = bench_params()
    fmt = LaneFormat(p["workers"], tuple(p["widths"]))
    rng = random.Random(p["seed"])
    clamped = 0
    for _ in range(p["n"]):
        w = rng.choice(fmt.widths)
        per = 32 // w
        lo, hi = -(1 << (w - 1)), (1 << (w - 1)) - 1
        vals = [rng.choice((lo, hi, rng.randint(lo, hi), rng.randint(-3, 3))) for _ in range(per)]
        ok = [rng.random() < 0.85 for _ in range(fmt.nseg)]
        k = rng.choice((0, fmt.workers - 1, rng.randint(0, fmt.workers - 1)))
        prev = [sum(rng.randint(lo, hi) for _ in range(k)) for _ in range(per)]
        acc = sum(((v >> i) & 1) << q for j, v in enumerate(prev)
                  for i, q in enumerate(fmt.span(w, j)))
        acc |= sum(rng.getrandbits(1) << q for q in fmt.gaps())
        word = word_py(vals, w)
        dut.word.value = word
        dut.width.value = Width.of_bits(w).value
        dut.ok.value = sum(b << i for i, b in enumerate(ok))
        dut.acc.value = acc
        await Timer(1, unit="ns")
        addend = int(dut.addend.value)
        assert addend == unpack_py(fmt, word, w, ok), f"int{w}: addend of {word:#010x}"
        s = int(dut.sum.value)
        assert s == add_py(fmt, acc, addend, w), f"int{w}: sum"
        want = [q + (v if ok[j] else 0) for j, (q, v) in enumerate(zip(prev, vals))]
        assert acc_values_py(fmt, s, w) == want, f"int{w}: {acc_values_py(fmt, s, w)} != {want}"
        out, c = pack_py(fmt, s, w)
        assert elements_py(out, w) == [min(hi, max(lo, v)) for v in want]
        assert (int(dut.packed.value), int(dut.clamped.value)) == (out, int(c)), f"int{w}: pack"
        clamped += c
    assert fmt.workers == 1 or clamped > p["n"] // 20, f"only {clamped} clamped"
