"""Bench of :class:`~ina_fabric.hw.eth.egress.Router`: RESULT copies to workers in and
out of the subnet and to multicast groups, with idle cycles, both outputs under
backpressure: each copy whole on the port the rule says (subnet or multicast: port 0,
else the uplink), in order."""

import cocotb

from ina_fabric.hw.eth.egress import CORE_OUT
from ina_fabric.sim.bench import Bench, bench_params


@cocotb.test()
async def test_router(dut):
    p = bench_params()
    b = Bench(dut, seed=p["seed"])
    src = b.source("i", CORE_OUT, idle=p["idle"])
    outs = [b.sink(f"o{k}", CORE_OUT, backpressure=p["bp"]) for k in range(2)]
    net, mask = 0xC6120000, (0xFFFFFFFF << (32 - p["prefix"])) & 0xFFFFFFFF
    await b.reset(net=net, mask=mask)
    want = [[], []]
    for k in range(p["n"]):
        inside = b.rng.random() < 0.5
        dip = (net & mask) | (b.rng.getrandbits(32) & ~mask) if inside else b.rng.getrandbits(32)
        mcast = int(b.rng.random() < 0.2)
        port = 0 if ((dip & mask) == (net & mask) or mcast) else 1
        beats = [{"data": b.rng.getrandbits(32), "n": 1, "first": int(j == 0),
                  "last": int(j == 2), "length": 12, "dst_ip": dip, "mcast": mcast,
                  "dst_port": k} for j in range(3)]
        src.send(beats)
        want[port] += beats
    n = sum(map(len, want))
    await b.run_until(lambda: sum(len(o.got) for o in outs) == n, 40 * n + 200)
    for k in range(2):
        got = [{f: x[f] for f in ("data", "first", "last", "dst_ip", "mcast", "dst_port")}
               for x in outs[k].got]
        exp = [{f: x[f] for f in ("data", "first", "last", "dst_ip", "mcast", "dst_port")}
               for x in want[k]]
        assert got == exp, f"port {k}"
