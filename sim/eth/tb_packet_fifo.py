"""Bench of :class:`~ina_fabric.hw.eth.words.PacketFIFO`: packets out whole and in
order, under idle cycles and backpressure; a packet is shown only once all of it is in,
so it leaves without bubbles (``valid`` high from its first beat to its last)."""

import cocotb

from ina_fabric.sim.bench import Bench, bench_params
from ina_fabric.sim.eth.tb_stream_blocks import beat_layout, random_packets


@cocotb.test()
async def test_packet_fifo(dut):
    p = bench_params()
    lay = beat_layout(p["width"])
    b = Bench(dut, seed=p["seed"])
    src = b.source("i", lay, idle=p["idle"])
    snk = b.sink("o", lay, backpressure=p["bp"])
    await b.reset()
    pkts = random_packets(b.rng, p["n"], p["width"], p["depth"] - 2)
    beats = [x for pk in pkts for x in pk]
    src.send(beats)
    in_pkt = False
    for _ in range(40 * len(beats) + 200):
        await b.step()
        if in_pkt and snk.ready:
            assert b.rd("o__valid"), f"a bubble inside a packet at cycle {b.cycle}"
        if snk.got:
            in_pkt = snk.got[-1]["last"] == 0
        if len(snk.got) == len(beats):
            break
    assert snk.got == beats
