"""Bench of :class:`~ina_fabric.hw.eth.mac.PacketBuffer`: frames with every status (good,
and each reason a frame is bad), idle cycles between bytes and frames, the output under
backpressure; the good frames come out whole and in order (those that did not fit are
counted as overflows, never cut), no bad frame comes out, and ``frames`` and the
``drops`` counters add up to what was sent (each reason exactly, when nothing overflows)."""

import cocotb

from ina_fabric.hw.eth.mac import BYTE, RX_BYTE, RxStatus
from ina_fabric.sim.bench import Bench, bench_params


@cocotb.test()
async def test_packet_buffer(dut):
    p = bench_params()
    b = Bench(dut, seed=p["seed"])
    src = b.source("i", RX_BYTE, idle=p["idle"])
    snk = b.sink("o", BYTE, backpressure=p["bp"])
    await b.reset()
    sent, bad = [], {s.value: 0 for s in RxStatus}
    for k in range(p["n"]):
        n = b.rng.randint(1, p["max_len"])
        st = RxStatus.OK if b.rng.random() < 0.6 else b.rng.choice(list(RxStatus)[1:])
        body = bytes(b.rng.getrandbits(8) for _ in range(n))
        src.send([{"data": x, "last": int(j == n - 1), "status": st.value if j == n - 1 else 0}
                  for j, x in enumerate(body)])
        if st == RxStatus.OK:
            sent.append(body)
        else:
            bad[st.value] += 1
    await b.run_until(lambda: src.done, 100 * p["n"] * p["max_len"])
    await b.step(p["depth"] * 4)
    got, cur = [], bytearray()
    for x in snk.got:
        cur.append(x["data"])
        if x["last"]:
            got.append(bytes(cur))
            cur = bytearray()
    assert not cur, "a frame cut short at the output"
    it = iter(sent)
    assert all(any(g == s for s in it) for g in got), "an output frame not sent, or out of order"
    drops = b.rd("drops")
    d = [(drops >> (32 * r)) & 0xFFFFFFFF for r in range(6)]
    assert b.rd("frames") == len(got), f"frames {b.rd('frames')}, {len(got)} out"
    # (a frame that meets a full buffer is an overflow, whatever its own status)
    assert len(got) + sum(d) == len(sent) + sum(bad.values()), f"frames {len(got)}, drops {d}"
    for s in list(RxStatus)[1:5]:
        assert d[s.value] <= bad[s.value], f"drops[{s.name}] {d[s.value]}, sent {bad[s.value]}"
    if p.get("no_overflow"):
        assert len(got) == len(sent), "a good frame dropped"
        assert all(d[v] == bad[v] for v in bad), f"drops {d}, sent {bad}"
