"""A small sequential SHA-256 compression core (FIPS 180-4), for the control plane's
HMAC (control is rare: this core is small, not fast).

Ports::

    restart   In(1)    set the chaining state to the initial value H0 (one cycle)
    i         In(stream.Signature(32))  the words of one 64-byte block, big-endian, 16
              words per block; the 16th word starts the compression
    busy      Out(1)   a compression runs (``i.ready`` is low meanwhile)
    digest    Out(8 x 32)  the chaining state H0..H7 (the digest after the last block)

The 64 rounds take four cycles each (256 cycles per block after its 16 words), so that
every add is a two-operand add behind at most one level of logic: the core keeps the
board's 75 MHz with room (one round in one cycle would be a five-operand add). The four
phases also let the message schedule live in a 16-word LUT RAM read once per phase
(W[t], W[t+9], W[t+1], W[t+14]) instead of 512 flip-flops shifted every round.

Python twins :func:`compress_py` and :data:`IV` are for the tests (checked against
``hashlib``).
"""

from amaranth.hdl import *
from amaranth.lib import wiring, stream, data, memory
from amaranth.lib.wiring import In, Out

__all__ = ["Sha256", "K", "IV", "compress_py"]

K = (
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
)
IV = (0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
      0x5be0cd19)

_M = 0xFFFFFFFF


def _rotr_py(x, n):
    return ((x >> n) | (x << (32 - n))) & _M


def compress_py(state, block: bytes):
    """The SHA-256 compression function: the chaining state after one 64-byte block."""
    w = [int.from_bytes(block[4 * k:4 * k + 4], "big") for k in range(16)]
    for t in range(16, 64):
        s0 = _rotr_py(w[t - 15], 7) ^ _rotr_py(w[t - 15], 18) ^ (w[t - 15] >> 3)
        s1 = _rotr_py(w[t - 2], 17) ^ _rotr_py(w[t - 2], 19) ^ (w[t - 2] >> 10)
        w.append((w[t - 16] + s0 + w[t - 7] + s1) & _M)
    a, b, c, d, e, f, g, h = state
    for t in range(64):
        t1 = (h + (_rotr_py(e, 6) ^ _rotr_py(e, 11) ^ _rotr_py(e, 25))
              + ((e & f) ^ (~e & g)) + K[t] + w[t]) & _M
        t2 = ((_rotr_py(a, 2) ^ _rotr_py(a, 13) ^ _rotr_py(a, 22))
              + ((a & b) ^ (a & c) ^ (b & c))) & _M
        a, b, c, d, e, f, g, h = (t1 + t2) & _M, a, b, c, (d + t1) & _M, e, f, g
    return tuple((x + y) & _M for x, y in zip(state, (a, b, c, d, e, f, g, h)))


def _rotr(x, n):
    return x.rotate_right(n)


class Sha256(wiring.Component):
    """SHA-256 compression, one block at a time (see the module docstring)."""

    restart: In(1)
    i: In(stream.Signature(32))
    busy: Out(1)
    digest: Out(data.ArrayLayout(32, 8))

    def elaborate(self, platform):
        m = Module()
        m.submodules.k = kmem = memory.Memory(shape=32, depth=64, init=K)
        krd = kmem.read_port()

        H = [Signal(32, name=f"h{k}", init=IV[k]) for k in range(8)]
        v = [Signal(32, name=f"v_{n}") for n in "abcdefgh"]
        a, b, c, d, e, f, g, h = v
        # the message schedule: 16 words in a LUT RAM, W[t] at address t mod 16, read
        # through one asynchronous port, one word per phase (W[t], W[t+9], W[t+1],
        # W[t+14]); W[t+16] is written (over W[t]) in the next round's first phase
        m.submodules.wmem = wmem = memory.Memory(shape=32, depth=16, init=[])
        wrd = wmem.read_port(domain="comb")
        wwr = wmem.write_port()
        raddr = Signal(4)               # the word read in the current phase
        m.d.comb += wrd.addr.eq(raddr)
        wq = wrd.data
        nw = Signal(range(17))          # words loaded into the block
        rnd = Signal(6)
        ph = Signal(2)
        run = Signal()
        fin = Signal()                  # add the working variables into H
        m.d.comb += [self.busy.eq(run | fin), self.i.ready.eq(~run & ~fin & ~self.restart)]
        for k in range(8):
            m.d.comb += self.digest[k].eq(H[k])
        m.d.comb += krd.addr.eq(rnd)

        x = Signal(32)      # h + W[t], then + K[t]
        s1 = Signal(32)     # Sigma1(e) + Ch(e, f, g)
        s0 = Signal(32)     # Sigma0(a) + Maj(a, b, c)
        t1 = Signal(32)
        y = Signal(32)      # W[t] + W[t+9]   (the schedule's W[t+16], in parts)
        q = Signal(32)      # sigma0(W[t+1])
        y2 = Signal(32)     # sigma0(W[t+1]) + sigma1(W[t+14])
        wt = Signal(32)     # W[t]
        wpend = Signal()    # W[t+16] = y + y2 waits to be written (round t+1, phase 0)
        wpa = Signal(4)     # ... at this address (t mod 16)

        with m.If(self.restart):
            m.d.sync += [H[k].eq(IV[k]) for k in range(8)]
            m.d.sync += nw.eq(0)
        with m.Elif(self.i.valid & self.i.ready):
            m.d.comb += [wwr.addr.eq(nw[:4]), wwr.data.eq(self.i.payload), wwr.en.eq(1)]
            with m.If(nw == 15):
                m.d.sync += [nw.eq(0), run.eq(1), rnd.eq(0), ph.eq(0), raddr.eq(0),
                             wpend.eq(0)]
                m.d.sync += [v[k].eq(H[k]) for k in range(8)]
            with m.Else():
                m.d.sync += nw.eq(nw + 1)

        with m.If(run):
            m.d.sync += ph.eq(ph + 1)
            with m.Switch(ph):
                with m.Case(0):     # (K[t] is read at ``rnd`` now, shown in phase 1)
                    m.d.sync += [
                        x.eq(h + wq),
                        wt.eq(wq),
                        s1.eq((_rotr(e, 6) ^ _rotr(e, 11) ^ _rotr(e, 25))
                              + ((e & f) ^ (~e & g))),
                        s0.eq((_rotr(a, 2) ^ _rotr(a, 13) ^ _rotr(a, 22))
                              + ((a & b) ^ (a & c) ^ (b & c))),
                        raddr.eq(rnd[:4] + 9),
                    ]
                    with m.If(wpend):
                        m.d.comb += [wwr.addr.eq(wpa), wwr.data.eq(y + y2), wwr.en.eq(1)]
                        m.d.sync += wpend.eq(0)
                with m.Case(1):
                    m.d.sync += [x.eq(x + krd.data), y.eq(wt + wq), raddr.eq(rnd[:4] + 1)]
                with m.Case(2):
                    m.d.sync += [t1.eq(x + s1),
                                 q.eq(_rotr(wq, 7) ^ _rotr(wq, 18) ^ (wq >> 3)),
                                 raddr.eq(rnd[:4] + 14)]
                with m.Case(3):
                    m.d.sync += [a.eq(t1 + s0), b.eq(a), c.eq(b), d.eq(c), e.eq(d + t1),
                                 f.eq(e), g.eq(f), h.eq(g)]
                    m.d.sync += [y2.eq(q + (_rotr(wq, 17) ^ _rotr(wq, 19) ^ (wq >> 10))),
                                 wpend.eq(1), wpa.eq(rnd[:4]), rnd.eq(rnd + 1),
                                 raddr.eq(rnd[:4] + 1)]
                    with m.If(rnd == 63):
                        m.d.sync += [run.eq(0), fin.eq(1), wpend.eq(0)]
        with m.If(fin):
            m.d.sync += fin.eq(0)
            m.d.sync += [H[k].eq(H[k] + v[k]) for k in range(8)]
        return m
