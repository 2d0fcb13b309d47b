"""Bench of :class:`~ina_fabric.hw.ina.replay.ReplayStore`: nonces (fresh, repeated,
old, ascending) against the protocol's own rule, ``auth.ReplayGuard``; random idle
cycles between checks."""

import cocotb

from ina_fabric.protocol.auth import ReplayGuard
from ina_fabric.sim.bench import Bench, bench_params


@cocotb.test()
async def test_replay_store(dut):
    p = bench_params()
    b = Bench(dut, seed=p["seed"])
    model = ReplayGuard(p["slots"])
    await b.reset(start=0, nonce=0)
    seen, base = [], 1 << 40
    for k in range(p["n"]):
        r = b.rng.random()
        if seen and r < 0.3:
            nonce = b.rng.choice(seen)                          # a replay
        elif r < 0.4:
            nonce = b.rng.getrandbits(b.rng.choice((8, 64)))    # anything, old or huge
        else:
            base += b.rng.randint(-3 * p["slots"], 10)          # mostly ascending
            nonce = base
        seen.append(nonce)
        for _ in range(b.rng.choice((0, 0, 1, 5))):             # idle cycles
            await b.step()
        b.wr("nonce", nonce)
        b.wr("start", 1)
        await b.step()
        b.wr("start", 0)
        for cyc in range(p["slots"] + 4):
            await b.step()
            if b.rd("done"):
                break
        else:
            raise AssertionError(f"check {k}: no done")
        want = model.take(nonce)
        assert b.rd("fresh") == want, f"check {k}: nonce {nonce:#x}: fresh {b.rd('fresh')}, model {want}"
