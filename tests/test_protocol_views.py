"""All generated views of the wire format agree, field by field."""

import re

import numpy as np
from hypothesis import given, settings, strategies as st
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import rdpcap, wrpcap

from ina_fabric.protocol import (HEADER_FIELDS, HEADER_BYTES, HEADER_DTYPE, INA_UDP_PORT, pack,
                           unpack, field_offsets, MsgType)
from ina_fabric.protocol.scapy_view import INA
from ina_fabric.protocol.wireshark import lua_dissector


def field_strategy(f):
    if f.signed:
        return st.integers(-(1 << (f.bits - 1)), (1 << (f.bits - 1)) - 1)
    return st.integers(0, (1 << f.bits) - 1)


headers = st.fixed_dictionaries({f.name: field_strategy(f) for f in HEADER_FIELDS
                                 if f.name != "nelem"})
elements = st.lists(st.integers(-(1 << 31), (1 << 31) - 1), max_size=64)


@given(headers, elements)
@settings(max_examples=200, deadline=None)
def test_numpy_and_scapy_agree(fields, elems):
    raw = pack(elems, **fields)
    assert len(raw) == HEADER_BYTES + 4 * len(elems)
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


def test_unpack_rejects_truncated_header():
    import pytest
    with pytest.raises(ValueError, match="truncated"):
        unpack(b"\x01\x02\x03")
