"""All generated views of the wire format agree, field by field."""

import re

import numpy as np
from hypothesis import given, settings, strategies as st
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import rdpcap, wrpcap

from ina_fabric.protocol import (HEADER_FIELDS, HEADER_BYTES, HEADER_DTYPE, INA_UDP_PORT, pack,
                           unpack, field_offsets, MsgType, width_byte)
from ina_fabric.protocol.scapy_view import INA
from ina_fabric.protocol.wireshark import lua_dissector


def field_strategy(f):
    if f.signed:
        return st.integers(-(1 << (f.bits - 1)), (1 << (f.bits - 1)) - 1)
    return st.integers(0, (1 << f.bits) - 1)


headers = st.fixed_dictionaries({f.name: field_strategy(f) for f in HEADER_FIELDS
                                 if f.name not in ("nelem", "width")})


@st.composite
def headers_and_elements(draw):
    """Header fields with a width byte that names a width (``fields.width_byte``), and
    elements of that width."""
    fields = draw(headers)
    bits = draw(st.sampled_from([32, 16, 8]))
    fields["width"] = width_byte(bits, draw(st.sampled_from([b for b in (32, 16, 8)
                                                             if b <= bits])))
    lim = 1 << bits - 1
    return fields, draw(st.lists(st.integers(-lim, lim - 1), max_size=64)), bits


@given(headers_and_elements())
@settings(max_examples=200, deadline=None)
def test_numpy_and_scapy_agree(drawn):
    fields, elems, bits = drawn
    raw = pack(elems, **fields)
    assert len(raw) == HEADER_BYTES + bits // 8 * len(elems)
    hdr, body = unpack(raw)
    pkt = INA(raw)
    for f in HEADER_FIELDS:
        expect = len(elems) if f.name == "nelem" else fields[f.name]
        assert int(hdr[f.name]) == expect
        assert int(pkt.getfieldval(f.name)) == expect
    assert list(body) == elems == list(pkt.elements)
    # scapy builds the very same bytes
    rebuilt = INA(**{f.name: int(hdr[f.name]) for f in HEADER_FIELDS}, elements=elems)
    assert bytes(rebuilt) == raw


@given(st.lists(headers, min_size=1, max_size=50))
@settings(max_examples=50, deadline=None)
def test_bulk_numpy_view(many):
    arr = np.zeros(len(many), HEADER_DTYPE)
    for i, fields in enumerate(many):
        for k, v in fields.items():
            arr[i][k] = v
    blob = arr.tobytes()
    for i, fields in enumerate(many):
        hdr, _ = unpack(blob[i * HEADER_BYTES:(i + 1) * HEADER_BYTES])
        assert all(int(hdr[k]) == v for k, v in fields.items())


def test_lua_dissector_offsets_match_dtype():
    lua = lua_dissector()
    offsets = field_offsets()
    for f in HEADER_FIELDS:
        m = re.search(rf"t:add\(f_{f.name}, buf\((\d+), (\d+)\)\)", lua)
        assert m, f.name
        assert int(m.group(1)) == offsets[f.name] == HEADER_DTYPE.fields[f.name][1]
        assert int(m.group(2)) == f.nbytes == HEADER_DTYPE.fields[f.name][0].itemsize
    assert f'add({INA_UDP_PORT}, ina)' in lua


def test_scapy_dissects_pcap(tmp_path):
    raw = pack([1, -2, 3], type=MsgType.RESULT, job=7, seq=99, bitmap=0xF, count=4)
    frame = Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=20000,
                                                                 dport=INA_UDP_PORT) / raw
    path = tmp_path / "ina.pcap"
    wrpcap(str(path), [frame])
    pkt = rdpcap(str(path))[0]
    assert pkt.haslayer(INA)
    assert pkt[INA].job == 7 and pkt[INA].seq == 99 and pkt[INA].elements == [1, -2, 3]


def test_narrow_elements_on_the_wire():
    """An int16/int8 datagram's payload is nelem * 2 / nelem * 1 bytes, big-endian; an
    int32 one has width 0, byte for byte what version 2 sent before widths existed."""
    raw = pack([1, -2, 300], width=width_byte(16), job=7)
    assert raw[HEADER_BYTES:] == bytes.fromhex("0001fffe012c")
    assert raw[field_offsets()["width"]] == 0x11
    assert pack([1, -2, 3], width=width_byte(8))[HEADER_BYTES:] == bytes([1, 0xFE, 3])
    assert pack([1, -2, 3], job=7) == pack([1, -2, 3], job=7, width=width_byte(32))
    assert pack([1, -2, 3])[field_offsets()["width"]] == 0
    assert INA(pack([5, -6], width=width_byte(8))).elements == [5, -6]
    import pytest
    with pytest.raises(ValueError, match="does not fit 8 bits"):
        pack([200], width=width_byte(8))
    with pytest.raises(ValueError, match="32, 16, 8"):
        width_byte(4)


def test_lua_dissector_reads_the_width():
    lua = lua_dissector()
    assert f"buf({field_offsets()['width']}, 1):uint() % 16" in lua
    assert "f_elem8" in lua and "f_elem16" in lua


def test_unpack_rejects_truncated_header():
    import pytest
    with pytest.raises(ValueError, match="truncated"):
        unpack(b"\x01\x02\x03")
