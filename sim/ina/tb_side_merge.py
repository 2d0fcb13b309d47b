"""Bench of :class:`~ina_fabric.hw.ina.answer.SideMerge`: packets of one to four beats on
both inputs with random idle cycles, the output with random backpressure: every packet
comes out whole (its beats together), each input's packets in their order, none lost."""

import cocotb

from ina_fabric.hw.ina.layout import out_layout
from ina_fabric.sim.bench import Bench, bench_params


@cocotb.test()
async def test_side_merge(dut):
    p = bench_params()
    L = p["lanes"]
    OL = out_layout(L)
    b = Bench(dut, seed=p["seed"])
    srcs = {"a": b.source("a", OL, idle=p["idle"]), "b": b.source("b", OL, idle=p["idle"])}
    snk = b.sink("o", OL, backpressure=p["bp"])
    await b.reset()
    sent = {"a": [], "b": []}
    for name, s in srcs.items():
        for k in range(p["n"]):
            nb = b.rng.randint(1, 4)
            beats = [{"data": b.rng.getrandbits(32 * L), "n": b.rng.randint(1, L),
                      "first": int(i == 0), "last": int(i == nb - 1), "length": k,
                      "dst_port": (name == "b") << 15 | k, "dst_ip": b.rng.getrandbits(32),
                      "dst_mac": b.rng.getrandbits(48), "ip_checksum": b.rng.getrandbits(16),
                      "mcast": 0} for i in range(nb)]
            sent[name].append(beats)
            s.send(beats)
    total = sum(len(x) for v in sent.values() for x in v)
    await b.run_until(lambda: len(snk.got) == total, timeout=50 * total)
    got = {"a": [], "b": []}
    cur = None
    for beat in snk.got:
        if cur is None:
            assert beat["first"], "a packet begins without its first beat"
            cur = []
        cur.append(beat)
        if beat["last"]:
            name = "b" if cur[0]["dst_port"] >> 15 else "a"
            assert all(x["dst_port"] == cur[0]["dst_port"] for x in cur), "interleaved"
            got[name].append(cur)
            cur = None
    for name in "ab":
        assert got[name] == sent[name], f"input {name}: packets differ or out of order"
    assert len(snk.got) == total
