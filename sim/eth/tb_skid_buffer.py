"""Bench of :class:`~ina_fabric.hw.eth.words.SkidBuffer`: every beat out once, in order,
under idle cycles and backpressure; a beat per cycle when neither."""

import cocotb

from ina_fabric.sim.bench import Bench, bench_params
from ina_fabric.sim.eth.tb_stream_blocks import beat_layout, random_packets


@cocotb.test()
async def test_skid_buffer(dut):
    p = bench_params()
    lay = beat_layout(p["width"])
    b = Bench(dut, seed=p["seed"])
    src = b.source("i", lay, idle=p["idle"])
    snk = b.sink("o", lay, backpressure=p["bp"])
    await b.reset()
    beats = [x for pk in random_packets(b.rng, p["n"], p["width"], 4) for x in pk]
    src.send(beats)
    await b.run_until(lambda: len(snk.got) == len(beats), 20 * len(beats) + 100)
    assert snk.got == beats
    if not p["idle"] and not p["bp"]:
        assert b.cycle <= len(beats) + 4, f"{len(beats)} beats took {b.cycle} cycles"
