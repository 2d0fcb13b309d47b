"""Bench of :class:`~ina_fabric.hw.eth.words.PacketArbiter`: packets from every input,
with idle cycles, under backpressure: each comes out whole (never interleaved), each
input's in order, none lost."""

import cocotb

from ina_fabric.sim.bench import Bench, bench_params
from ina_fabric.sim.eth.tb_stream_blocks import beat_layout, random_packets


@cocotb.test()
async def test_packet_arbiter(dut):
    p = bench_params()
    lay = beat_layout(p["width"] + 4)       # data: the input's number, then random bits
    b = Bench(dut, seed=p["seed"])
    srcs = [b.source(f"i{k}", lay, idle=p["idle"]) for k in range(p["inputs"])]
    snk = b.sink("o", lay, backpressure=p["bp"])
    await b.reset()
    sent = []
    for k, s in enumerate(srcs):
        pk = random_packets(b.rng, p["n"], p["width"], 5)
        pk = [[{**x, "data": (x["data"] << 4) | k} for x in q] for q in pk]
        sent.append(pk)
        s.send([x for q in pk for x in q])
    total = sum(len(q) for pk in sent for q in pk)
    await b.run_until(lambda: len(snk.got) == total, 50 * total + 200)
    got = [[] for _ in srcs]
    cur = []
    for x in snk.got:
        cur.append(x)
        if x["last"]:
            srcs_of = {y["data"] & 15 for y in cur}
            assert len(srcs_of) == 1, f"a packet mixes inputs {srcs_of}"
            got[srcs_of.pop()].append(cur)
            cur = []
    assert got == sent
