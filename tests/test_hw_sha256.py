"""The gateware SHA-256 core and the HMAC the control plane computes with it, against
``hashlib`` / ``hmac`` (Amaranth's simulator)."""

import hashlib
import hmac
import os
import random

from amaranth.sim import Simulator

from ina_fabric.hw.ina.sha256 import Sha256, IV, compress_py


def _pad(msg: bytes, prefix_bytes: int = 0) -> bytes:
    n = len(msg) + prefix_bytes
    return msg + b"\x80" + b"\0" * ((55 - n) % 64) + (8 * n).to_bytes(8, "big")


def test_compress_py_is_sha256():
    for n in (0, 3, 55, 56, 64, 200):
        msg = os.urandom(n)
        p = _pad(msg)
        st = IV
        for k in range(0, len(p), 64):
            st = compress_py(st, p[k:k + 64])
        assert b"".join(x.to_bytes(4, "big") for x in st) == hashlib.sha256(msg).digest()


def _run_blocks(messages):
    """Digests of ``messages`` computed by the gateware core, one after the other."""
    dut = Sha256()
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    out = []

    async def tb(ctx):
        for msg in messages:
            ctx.set(dut.restart, 1)
            await ctx.tick()
            ctx.set(dut.restart, 0)
            p = _pad(msg)
            words = [int.from_bytes(p[k:k + 4], "big") for k in range(0, len(p), 4)]
            rng = random.Random(len(msg))
            for wd in words:
                ctx.set(dut.i.payload, wd)
                ctx.set(dut.i.valid, 1)
                while not ctx.get(dut.i.ready):
                    await ctx.tick()
                await ctx.tick()
                ctx.set(dut.i.valid, 0)
                for _ in range(rng.randrange(2)):
                    await ctx.tick()
            # wait until the last compression has landed
            await ctx.tick()
            while ctx.get(dut.busy):
                await ctx.tick()
            out.append(b"".join(ctx.get(dut.digest[k]).to_bytes(4, "big") for k in range(8)))
    sim.add_testbench(tb)
    sim.run()
    return out


def test_gateware_sha256_matches_hashlib():
    msgs = [b"", b"abc", os.urandom(55), os.urandom(64), os.urandom(130)]
    got = _run_blocks(msgs)
    assert got[1] == bytes.fromhex(
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    assert _run_blocks(msgs) == [hashlib.sha256(m).digest() for m in msgs]


def test_hmac_from_key_blocks_is_hmac_sha256():
    """The control plane's HMAC: the two key blocks (control.hmac_blocks), the message
    after the first, the inner digest after the second, as the gateware sequences them."""
    from ina_fabric.hw.ina.control import hmac_blocks
    for key in (bytes(range(32)), b"k" * 16, os.urandom(80)):
        msg = os.urandom(100)
        ipad, opad = hmac_blocks(key)
        words = lambda ws: b"".join(w.to_bytes(4, "big") for w in ws)
        st = compress_py(IV, words(ipad))
        p = _pad(msg, prefix_bytes=64)
        for k in range(0, len(p), 64):
            st = compress_py(st, p[k:k + 64])
        inner = words(st)
        st = compress_py(IV, words(opad))
        st = compress_py(st, _pad(inner, prefix_bytes=64))
        assert words(st) == hmac.new(key, msg, hashlib.sha256).digest()
