"""Datagram <-> stream beats for the INA core (plain Python, no simulator needed).

A datagram's words are big-endian 32-bit; the 7 header words fill ceil(7/L) beats, then
the elements start on a new beat (hw/ina/layout.py). Payloads are packed into the flat
integer a simulator sees on ``i__payload`` / ``o__payload`` from the Amaranth layouts.
"""

from ina_fabric.hw.ina.layout import in_layout, out_layout
from ina_fabric.hw.ina.params import HEADER_WORDS

__all__ = ["Packer", "datagram_beats", "beats_datagram", "in_payloads", "packers",
           "source_mac"]


class Packer:
    """Pack/unpack flat payload integers for one StructLayout."""

    def __init__(self, layout):
        self.fields = {name: (f.offset, f.width) for name, f in layout}

    def pack(self, **values) -> int:
        out = 0
        for name, v in values.items():
            off, width = self.fields[name]
            out |= (int(v) & ((1 << width) - 1)) << off
        return out

    def unpack(self, value: int) -> dict:
        return {name: (value >> off) & ((1 << width) - 1)
                for name, (off, width) in self.fields.items()}


def _words(datagram: bytes) -> list[int]:
    pad = (-len(datagram)) % 4
    b = datagram + b"\0" * pad
    return [int.from_bytes(b[k:k + 4], "big") for k in range(0, len(b), 4)]


def datagram_beats(datagram: bytes, lanes: int) -> list[tuple[list[int], int]]:
    """[(lane words, n valid)] for one datagram: header words, then elements."""
    words = _words(datagram)
    hdr, body = words[:HEADER_WORDS], words[HEADER_WORDS:]
    beats = []
    for part in (hdr, body):
        for k in range(0, len(part), lanes):
            chunk = part[k:k + lanes]
            beats.append((chunk + [0] * (lanes - len(chunk)), len(chunk)))
    if not beats:
        beats.append(([0] * lanes, 1))   # an empty datagram still needs one beat
    return beats


def source_mac(source) -> int:
    """The Ethernet source address the benches give a datagram from ``source`` (ip,
    port): 02:xx:<ip> with xx the port's low byte (an ERROR goes back to it)."""
    ip = int.from_bytes(bytes(int(x) for x in source[0].split(".")), "big")
    return 0x02 << 40 | (source[1] & 0xFF) << 32 | ip


def in_payloads(datagram: bytes, source, lanes: int, packer: Packer) -> list[int]:
    beats = datagram_beats(datagram, lanes)
    ip = int.from_bytes(bytes(int(x) for x in source[0].split(".")), "big")
    out = []
    for k, (lane_words, n) in enumerate(beats):
        data = 0
        for j, w in enumerate(lane_words):
            data |= w << (32 * j)
        out.append(packer.pack(data=data, n=n, first=k == 0, last=k == len(beats) - 1,
                               length=len(datagram), src_ip=ip, src_port=source[1],
                               src_mac=source_mac(source)))
    return out


def beats_datagram(beats: list[dict], lanes: int) -> bytes:
    """Reassemble an output datagram from unpacked beats (each with data and n)."""
    out = bytearray()
    for b in beats:
        for j in range(b["n"]):
            out += ((b["data"] >> (32 * j)) & 0xFFFFFFFF).to_bytes(4, "big")
    return bytes(out)


def packers(lanes: int):
    return Packer(in_layout(lanes)), Packer(out_layout(lanes))
