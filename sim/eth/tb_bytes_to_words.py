"""Bench of :class:`~ina_fabric.hw.eth.words.BytesToWords`: datagrams of every length
modulo 4, with idle cycles and backpressure, against big-endian words (a short last word
padded with zeros), ``first``/``last`` and the datagram's fields on every word."""

import cocotb

from ina_fabric.hw.eth.ingress import INA_RX
from ina_fabric.hw.eth.words import CORE_IN
from ina_fabric.sim.bench import Bench, bench_params


@cocotb.test()
async def test_bytes_to_words(dut):
    p = bench_params()
    b = Bench(dut, seed=p["seed"])
    src = b.source("i", INA_RX, idle=p["idle"])
    snk = b.sink("o", CORE_IN, backpressure=p["bp"])
    await b.reset()
    want = []
    for k in range(p["n"]):
        n = b.rng.randint(1, 40)
        body = bytes(b.rng.getrandbits(8) for _ in range(n))
        meta = {"length": n, "src_mac": b.rng.getrandbits(48), "src_ip": b.rng.getrandbits(32),
                "src_port": b.rng.getrandbits(16)}
        src.send([{"data": x, "last": int(j == n - 1), **meta} for j, x in enumerate(body)])
        words = [int.from_bytes(body[j:j + 4].ljust(4, b"\0"), "big") for j in range(0, n, 4)]
        want += [{"data": w, "n": 1, "first": int(j == 0), "last": int(j == len(words) - 1),
                  **meta} for j, w in enumerate(words)]
    await b.run_until(lambda: len(snk.got) == len(want), 100 * len(want) + 200)
    for j, (g, w) in enumerate(zip(snk.got, want)):
        assert g == w, f"word {j}: {g} != {w}"
