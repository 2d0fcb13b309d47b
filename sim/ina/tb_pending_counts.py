"""Bench of :class:`~ina_fabric.hw.ina.queue.PendingCounts`: requests added (0, 1 or 2,
one record a cycle) and finished (one record a cycle, only one with requests), idle
cycles between; ``nonzero`` against per-record counts, a cycle later."""

import cocotb

from ina_fabric.sim.bench import Bench, bench_params


@cocotb.test()
async def test_pending_counts(dut):
    p = bench_params()
    R, M = p["records"], p["max_pending"]
    b = Bench(dut, seed=p["seed"])
    await b.reset(add=0, add_hot=0, done_hot=0)
    cnt = [0] * R
    for cyc in range(p["n"]):
        add = hot = done = 0
        if b.rng.random() >= p["idle"]:
            r = b.rng.randrange(R)
            add = min(b.rng.randint(0, 2), M - cnt[r])
            hot = 1 << r
            busy = [k for k in range(R) if cnt[k]]
            if busy and b.rng.random() < 0.6:
                d = b.rng.choice(busy)
                if d != r or cnt[r] + add <= M:
                    done = 1 << d
        b.wr("add", add), b.wr("add_hot", hot), b.wr("done_hot", done)
        await b.step()
        got = b.rd("nonzero")
        want = sum(1 << k for k in range(R) if cnt[k])
        assert got == want, f"cycle {cyc}: nonzero {got:#x}, model {want:#x}"
        for k in range(R):
            cnt[k] += (add if hot >> k & 1 else 0) - (done >> k & 1)
            assert 0 <= cnt[k] <= M
