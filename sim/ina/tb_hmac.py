"""Bench of :class:`~ina_fabric.hw.ina.hmac.HmacSha256`: messages of every length class
(empty, one block, padding across a block, long) hashed from a buffer the bench answers
through the word reader (the word ``READ_LATENCY`` cycles after its address, garbage
otherwise, so a read taken early fails), against ``hmac``/``hashlib``."""

import hashlib
import hmac
import os

import cocotb

from ina_fabric.hw.ina.reader import READ_LATENCY
from ina_fabric.sim.bench import Bench, bench_params


@cocotb.test()
async def test_hmac(dut):
    p = bench_params()
    key = bytes.fromhex(p["key"])
    b = Bench(dut, seed=p["seed"])
    await b.reset(start=0, length=0, rd__word=0)
    lengths = p.get("lengths") or [0, 1, 3, 55, 56, 63, 64, 100, 119, 120, 200]
    for k, n in enumerate(lengths):
        msg = bytes(b.rng.getrandbits(8) for _ in range(n))
        words = [int.from_bytes(msg[i:i + 4].ljust(4, b"\0"), "big")
                 for i in range(0, len(msg), 4)]
        addrs = [None] * READ_LATENCY
        for _ in range(b.rng.choice((0, 3))):
            await b.step()
        b.wr("length", n)
        b.wr("start", 1)
        addr = None
        for cyc in range(20000):
            # the word for the address set READ_LATENCY cycles ago (the reader's contract)
            a = addrs[-READ_LATENCY]
            b.wr("rd__word", words[a] if a is not None and a < len(words)
                 else b.rng.getrandbits(32))
            await b.step()
            b.wr("start", 0)
            if b.rd("rd__en"):
                addr = b.rd("rd__addr")
            addrs.append(addr)
            if cyc > 2 and not b.rd("busy"):
                break
        else:
            raise AssertionError(f"message {k} ({n} bytes): busy for 20000 cycles")
        got = b"".join(((b.rd("digest") >> (32 * w)) & 0xFFFFFFFF).to_bytes(4, "big")
                       for w in range(8))
        assert got == hmac.new(key, msg, hashlib.sha256).digest(), f"message {k} ({n} bytes)"
