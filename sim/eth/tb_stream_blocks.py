"""What the benches of the stream glue (hw/eth/words.py) share: packets of random beats
in a ``{"data": width, "last": 1}`` layout, sent with idle cycles and taken with
backpressure."""

from amaranth.lib import data

__all__ = ["beat_layout", "random_packets"]


def beat_layout(width: int) -> data.StructLayout:
    return data.StructLayout({"data": width, "last": 1})


def random_packets(rng, n, width, max_len):
    """``n`` packets of 1..max_len beats: lists of ``{"data", "last"}``."""
    out = []
    for _ in range(n):
        k = rng.randint(1, max_len)
        out.append([{"data": rng.getrandbits(width), "last": int(j == k - 1)}
                    for j in range(k)])
    return out
