"""Bench of :class:`~ina_fabric.hw.eth.mac.MacTx`: packets of every size (padded to the
minimum frame) fed whole with idle time between them, taken by cocotbext-eth's GMII
sink: preamble and SFD, the payload, and an FCS it checks itself; the inter-frame gap
(12 bytes) between back-to-back frames."""

import cocotb
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.eth import GmiiSink

from ina_fabric.hw.eth.mac import BYTE, IFG
from ina_fabric.sim.bench import Bench, bench_params


@cocotb.test()
async def test_mac_tx(dut):
    p = bench_params()
    b = Bench(dut, seed=p["seed"])
    src = b.source("i", BYTE)          # (a packet's bytes come without gaps: idle between)
    snk = GmiiSink(dut.txd, dut.tx_er, dut.tx_en, dut.clk, dut.rst)
    await b.reset()
    gaps, idle, seen = [], 0, False

    async def watch():
        nonlocal idle, seen
        while True:
            await RisingEdge(dut.clk)
            if int(dut.tx_en.value):
                if not seen and idle:
                    gaps.append(idle)
                seen, idle = True, 0
            else:
                seen, idle = False, idle + 1
    cocotb.start_soon(watch())
    b.run_in_background()
    sent = []
    for k in range(p["n"]):
        n = b.rng.choice((1, 14, 59, 60, 61)) if b.rng.random() < 0.4 else b.rng.randint(1, 300)
        payload = bytes(b.rng.getrandbits(8) for _ in range(n))
        src.send([{"data": x, "last": int(j == n - 1)} for j, x in enumerate(payload)])
        sent.append(payload)
        if b.rng.random() < p["idle"]:
            while not src.done:
                await RisingEdge(dut.clk)
            await ClockCycles(dut.clk, b.rng.randint(1, 40))
    for k, payload in enumerate(sent):
        f = await snk.recv()
        assert f.check_fcs(), f"frame {k}: FCS"
        assert f.get_payload() == payload.ljust(60, b"\0"), f"frame {k}: payload"
        assert not any(f.error or []), f"frame {k}: tx_er"
    assert gaps and min(gaps[1:] or gaps) >= IFG, f"inter-frame gaps {sorted(set(gaps))[:5]}"
