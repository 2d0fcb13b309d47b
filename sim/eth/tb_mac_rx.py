"""Bench of :class:`~ina_fabric.hw.eth.mac.MacRx`: frames from cocotbext-eth's GMII
source (preamble, SFD, FCS that no one here wrote), good ones of every size, and bad
ones: FCS wrong, runts, giants (over ``max_frame``), a PHY error inside; idle time
between frames. Every frame's bytes (FCS stripped) and the status on its last byte
against what was sent."""

import cocotb
from cocotb.triggers import ClockCycles
from cocotbext.eth import GmiiFrame, GmiiSource

from ina_fabric.hw.eth.mac import RX_BYTE, RxStatus
from ina_fabric.sim.bench import Bench, bench_params


@cocotb.test()
async def test_mac_rx(dut):
    p = bench_params()
    b = Bench(dut, seed=p["seed"])
    snk = b.sink("o", RX_BYTE, backpressure=None)
    src = GmiiSource(dut.rxd, dut.rx_er, dut.rx_dv, dut.clk, dut.rst)
    await b.reset()
    b.run_in_background()
    want = []
    for k in range(p["n"]):
        kind = b.rng.choice(("ok", "ok", "ok", "fcs", "runt", "giant", "phy"))
        n = {"runt": b.rng.randint(1, 59), "giant": p["max_frame"] + b.rng.randint(1, 40)}.get(
            kind, b.rng.randint(1, p["max_frame"] - 4))
        payload = bytes(b.rng.getrandbits(8) for _ in range(n))
        f = GmiiFrame.from_payload(payload, min_len=0 if kind == "runt" else 60)
        if kind == "fcs":
            f.data[8 + b.rng.randrange(len(payload))] ^= 1 << b.rng.randrange(8)
        if kind == "phy":
            f.error = [0] * len(f.data)
            f.error[8 + b.rng.randrange(len(payload))] = 1
        status = {"ok": RxStatus.OK, "fcs": RxStatus.BAD_FCS, "runt": RxStatus.RUNT,
                  "giant": RxStatus.GIANT, "phy": RxStatus.PHY_ERR}[kind]
        want.append((payload.ljust(60, b"\0") if kind != "runt" else payload, status.value))
        await src.send(f)
        await src.wait()
        await ClockCycles(dut.clk, b.rng.randint(12, 30))
    await ClockCycles(dut.clk, 20)
    got, cur = [], bytearray()
    for x in snk.got:
        cur.append(x["data"])
        if x["last"]:
            got.append((bytes(cur), x["status"]))
            cur = bytearray()
    assert len(got) == len(want), f"{len(got)} frames out, {len(want)} sent"
    for k, ((gd, gs), (wd, ws)) in enumerate(zip(got, want)):
        assert gs == ws, f"frame {k}: status {gs}, want {ws}"
        if ws == RxStatus.OK.value:
            assert gd == wd, f"frame {k}: bytes"
