"""Bench of :class:`~ina_fabric.hw.ina.queue.RequestQueue`: up to two requests pushed a
cycle (a, b, or both), popped one at a time with random backpressure (pops withheld);
``head``, ``head_valid`` and ``level`` against a deque of the requests."""

import collections

import cocotb
from amaranth.lib import data

from ina_fabric.sim.bench import Bench, bench_params, pack

REQ = data.StructLayout({"rec": 8, "x": 16})


@cocotb.test()
async def test_request_queue(dut):
    p = bench_params()
    D = p["depth"]
    b = Bench(dut, seed=p["seed"])
    await b.reset(push_a=0, push_b=0, a=0, b=0, pop=0)
    q = collections.deque()
    for cyc in range(p["n"]):
        pa = pb = 0
        if b.rng.random() >= p["idle"]:
            pa, pb = b.rng.random() < 0.6, b.rng.random() < 0.5
        # the header pipeline keeps the requests held within ``depth`` (QUEUE_SLACK)
        while len(q) + pa + pb > D:
            pa, pb = (0, pb) if pa else (pa, 0)
        ra, rb = ({"rec": b.rng.getrandbits(8), "x": b.rng.getrandbits(16)} for _ in "ab")
        pop = int(b.rng.random() >= p["bp"])
        b.wr("push_a", pa), b.wr("push_b", pb), b.wr("pop", pop)
        b.wr("a", pack(REQ, ra)), b.wr("b", pack(REQ, rb))
        await b.step()
        assert b.rd("level") == len(q), f"cycle {cyc}: level {b.rd('level')}, model {len(q)}"
        assert b.rd("head_valid") == (len(q) > 0)
        if q:
            assert b.rd("head", REQ) == q[0], f"cycle {cyc}: head"
            if pop:
                q.popleft()
        q.extend([r for r, v in ((ra, pa), (rb, pb)) if v])
