"""The lane functions (hw/ina/lanes.py): narrow elements unpacked into the accumulator
format, summed with one adder whose carries stop between elements, and packed back
saturated, on Amaranth's simulator against their Python twins and exact sums."""

import random

import pytest
from amaranth.sim import Simulator

from ina_fabric.hw.ina.lanes import (LaneCodec, LaneFormat, Width, acc_values_py, add_py,
                                     elements_py, pack_py, unpack_py, word_py, words_of)


def test_format_sizes():
    assert LaneFormat(32, (32,)).bits == 37          # the int32-only accumulator
    assert LaneFormat(32, (8, 16, 32)).bits == 4 * 13 + 3
    assert LaneFormat(32, (16, 32)).bits == 2 * 21 + 1
    assert LaneFormat(4, (8, 16, 32)).seg == 10
    with pytest.raises(ValueError, match="with 32"):
        LaneFormat(4, (8, 16))
    with pytest.raises(ValueError):
        LaneFormat(4, (4, 32))
    assert [words_of(n, 8) for n in (0, 1, 4, 5)] == [0, 1, 1, 2]
    assert words_of(3, 16) == 2 and words_of(3, 32) == 3


def test_lane_word_is_big_endian_first_element_high():
    assert word_py([1, -2], 16) == 0x0001FFFE
    assert word_py([1, 2, 3, -1], 8) == 0x010203FF
    assert elements_py(0x80017FFF, 16) == [-32768 + 1, 32767]
    assert bytes.fromhex("7f80ff01") == word_py([127, -128, -1, 1], 8).to_bytes(4, "big")


def _random_sum(rng, w, k):
    return sum(rng.randint(-(1 << (w - 1)), (1 << (w - 1)) - 1) for _ in range(k))


@pytest.mark.parametrize("workers,widths", [(32, (8, 16, 32)), (4, (16, 32)),
                                            (2, (8, 32)), (32, (32,))])
def test_lane_codec_against_twins_and_exact_sums(workers, widths):
    fmt = LaneFormat(workers, widths)
    dut = LaneCodec(fmt)
    sim = Simulator(dut)
    seen = {"clamped": 0, "masked": 0}

    async def tb(ctx):
        rng = random.Random(workers)
        for _ in range(250):
            w = rng.choice(widths)
            per = 32 // w
            vals = [rng.choice((-(1 << (w - 1)), (1 << (w - 1)) - 1, rng.randint(-9, 9)))
                    for _ in range(per)]
            word = word_py(vals, w)
            ok = [rng.random() < 0.85 for _ in range(fmt.nseg)]
            # a sum of up to N - 1 earlier contributions, junk in the gap bits
            k = rng.choice((0, workers - 1, rng.randint(0, workers - 1)))
            prev = [_random_sum(rng, w, k) for _ in range(per)]
            acc = 0
            for j, v in enumerate(prev):
                for i, p in enumerate(fmt.span(w, j)):
                    acc |= ((v >> i) & 1) << p
            for p in fmt.gaps():
                acc |= rng.getrandbits(1) << p
            assert acc_values_py(fmt, acc, w) == prev
            ctx.set(dut.word, word)
            ctx.set(dut.width, Width.of_bits(w))
            ctx.set(dut.ok, sum(b << i for i, b in enumerate(ok)))
            ctx.set(dut.acc, acc)
            addend = ctx.get(dut.addend)
            assert addend == unpack_py(fmt, word, w, ok)
            s = ctx.get(dut.sum)
            assert s == add_py(fmt, acc, addend, w)
            want = [p + (v if ok[j] else 0) for j, (p, v) in enumerate(zip(prev, vals))]
            assert acc_values_py(fmt, s, w) == want          # exact, element by element
            lo, hi = -(1 << (w - 1)), (1 << (w - 1)) - 1
            word_out, clamped = pack_py(fmt, s, w)
            assert elements_py(word_out, w) == [min(hi, max(lo, v)) for v in want]
            assert clamped == any(not lo <= v <= hi for v in want)
            assert (ctx.get(dut.packed), ctx.get(dut.clamped)) == (word_out, clamped)
            seen["clamped"] += clamped
            seen["masked"] += not all(ok[:per])
    sim.add_testbench(tb)
    sim.run()
    assert seen["masked"] > 10
    assert workers == 1 or seen["clamped"] > 10
