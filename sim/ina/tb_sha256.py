"""Bench of :class:`~ina_fabric.hw.ina.sha256.Sha256`: padded messages fed a word at a
time with random idle cycles (``valid`` withheld), one block per compression, the
digest against ``hashlib``."""

import hashlib
import struct

import cocotb

from ina_fabric.sim.bench import Bench, bench_params


def _pad(msg: bytes) -> bytes:
    n = len(msg)
    return msg + b"\x80" + b"\0" * ((55 - n) % 64) + struct.pack(">Q", 8 * n)


@cocotb.test()
async def test_sha256(dut):
    p = bench_params()
    b = Bench(dut, seed=p["seed"])
    src = b.source("i", idle=p.get("idle", 0.3))
    await b.reset(restart=0)
    for n in p.get("lengths") or [0, 3, 55, 56, 64, 119, 150]:
        msg = bytes(b.rng.getrandbits(8) for _ in range(n))
        b.wr("restart", 1)
        await b.step()
        b.wr("restart", 0)
        padded = _pad(msg)
        for k in range(0, len(padded), 64):
            src.send([int.from_bytes(padded[w:w + 4], "big") for w in range(k, k + 64, 4)])
            await b.run_until(lambda: src.done, 2000, "the block's words taken")
            await b.step()
            await b.run_until(lambda: not b.rd("busy"), 2000, "the compression")
        got = b"".join(((b.rd("digest") >> (32 * w)) & 0xFFFFFFFF).to_bytes(4, "big")
                       for w in range(8))
        assert got == hashlib.sha256(msg).digest(), f"{n} bytes"
