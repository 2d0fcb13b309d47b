"""Element widths on the wire, summed in the switch (issue 40, docs/precision.md): the
reference model's rules, one directed test each, and the compiled engine beside it."""

import numpy as np
import pytest

from ina_fabric.host.switch import SwitchModel
from ina_fabric.host.switch import fast
from ina_fabric.protocol import pack, unpack, MsgType, Flags, HEADER_BYTES
from ina_fabric.protocol.fields import Refusal, width_byte, up_width, field_offsets
from ina_fabric.protocol.jobtable import JobConfig

from tree_net import TreeNet, SPINE, leaf_addr, worker_addr

ADDR = [("127.0.0.1", 5000 + w) for w in range(4)]
SESSION = 0x40A
MODELS = [SwitchModel] + ([fast.FastSwitchModel] if fast.available() else [])


def job(n=3, elements=4):
    return JobConfig(1, tuple(f"{a}:{p}" for a, p in ADDR[:n]), window=4,
                     elements=elements, session=SESSION)


def data(worker, seq, values, bits):
    return pack(values, job=1, worker=worker, seq=seq, session=SESSION,
                width=width_byte(bits))


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("bits", [32, 16, 8])
def test_a_narrow_slot_returns_its_width(cls, bits):
    m = cls([job()])
    vals = [[1, -2, 3, 4], [5, 6, -7, 8], [-9, 10, 11, 12]]
    out = []
    for w in range(3):
        d = data(w, 0, vals[w], bits)
        assert len(d) == HEADER_BYTES + 4 * bits // 8      # elements stay, bytes shrink
        out = m.process(d, ADDR[w], 0.0)
    res = out[0][1]
    assert len(res) == HEADER_BYTES + 4 * bits // 8
    h, body = unpack(res)
    assert h["type"] == MsgType.RESULT and h["width"] == width_byte(bits)
    assert list(body) == list(np.sum(vals, axis=0)) and not h["flags"] & Flags.OVERFLOW


def test_int32_bytes_are_those_of_version_2():
    """An int32 RESULT has width 0: the gateware's scoreboards see the bytes they did."""
    m = SwitchModel([job(n=1)])
    res = m.process(data(0, 0, [1, 2, 3, 4], 32), ADDR[0], 0.0)[0][1]
    assert res[field_offsets()["width"]] == 0
    assert res[HEADER_BYTES:] == np.array([1, 2, 3, 4], ">i4").tobytes()


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0)])
def test_saturated_once_when_emitted_whatever_the_order(cls, order):
    """int8 100 + 100 - 100: the int64 sum is 100 in every order (saturating at each add
    would give 27 in one of them); 100 + 100 + 100 saturates to 127, once, flagged."""
    m = cls([job()])
    vals = {0: [100, 100, 0, -128], 1: [100, 100, 0, -128], 2: [-100, 100, 0, -128]}
    for w in order:
        out = m.process(data(w, 0, vals[w], 8), ADDR[w], 0.0)
    h, body = unpack(out[0][1])
    assert list(body) == [100, 127, 0, -128]
    assert h["flags"] & Flags.OVERFLOW and m.counters["overflows"] == 1


@pytest.mark.parametrize("cls", MODELS)
def test_a_width_that_disagrees_with_its_slot_is_a_counted_refusal(cls):
    m = cls([job()])
    assert m.process(data(0, 0, [1, 1, 1, 1], 16), ADDR[0], 0.0) == []
    out = m.process(data(1, 0, [1, 1, 1, 1], 8), ADDR[1], 0.0)
    assert m.counters["drop_bad_width"] == 1 and m.counters["accepted"] == 1
    (dest, err), = out
    h, _ = unpack(err)
    assert dest == ADDR[1] and h["type"] == MsgType.ERROR and len(err) == HEADER_BYTES
    assert h["count"] == Refusal.BAD_WIDTH and h["bitmap"] == width_byte(16)
    # the worker re-sends at the slot's width: the slot completes, exact
    m.process(data(1, 0, [2, 2, 2, 2], 16), ADDR[1], 0.0)
    out = m.process(data(2, 0, [3, 3, 3, 3], 16), ADDR[2], 0.0)
    assert list(unpack(out[0][1])[1]) == [6] * 4
    # the next seq may open at another width (a controller changed the call's precision)
    m.process(data(0, 1, [1, 1, 1, 1], 8), ADDR[0], 0.0)
    m.process(data(1, 1, [1, 1, 1, 1], 8), ADDR[1], 0.0)
    out = m.process(data(2, 1, [1, 1, 1, 1], 8), ADDR[2], 0.0)
    assert unpack(out[0][1])[0]["width"] == width_byte(8)


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("byte", [0x03, 0x01, 0x02, 0x12, 0x30, 0xFF])
def test_a_width_byte_that_names_no_width_is_malformed(cls, byte):
    """Unknown codes, and a worker's DATA whose nibbles differ (only a child switch's may),
    are drop_malformed, with no answer, as a length that disagrees with nelem is."""
    m = cls([job()])
    d = bytearray(data(0, 0, [1, 1, 1, 1], 32))
    d[field_offsets()["width"]] = byte
    bits = {0x01: 16, 0x02: 8, 0x12: 16}.get(byte)
    if bits:                         # a length that agrees with the low nibble
        d = d[:HEADER_BYTES] + bytes(4 * bits // 8)
    assert m.process(bytes(d), ADDR[0], 0.0) == []
    assert m.counters["drop_malformed"] == 1 and m.counters["accepted"] == 0


def test_a_switch_without_narrow_widths_drops_them_as_malformed():
    """``widths``: what a switch that predates them (the gateware before 40c) does."""
    m = SwitchModel([job()], widths=(32,))
    assert m.process(data(0, 0, [1, 1, 1, 1], 16), ADDR[0], 0.0) == []
    assert m.counters["drop_malformed"] == 1


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("bits", [16, 8])
def test_a_tree_sends_narrow_partial_sums_up_wider_and_exact(cls, bits):
    """Leaf 0's int8 partial sum (3 x 100 = 300) does not fit int8; it goes up as int16,
    exact, and the root's total (300 - 270 = 30) is exact, with no OVERFLOW. For int16,
    3 x 30000 goes up as int32."""
    big = 100 if bits == 8 else 30000
    net = TreeNet([3, 3], cls=cls)
    for w in range(3):
        net.send(worker_addr(0, w), 0, [big, 1, 0, 0], width=bits)
        net.send(worker_addr(1, w), 0, [-(big - 10), 1, 0, 0], width=bits)
    net.run()
    ups = [d for _, src, dest, d in net.trunk if dest == SPINE]
    up = unpack(ups[0])[0]
    assert up["width"] == width_byte(up_width(bits, 6), bits)
    assert len(ups[0]) == HEADER_BYTES + 4 * up_width(bits, 6) // 8
    for a in net.workers:
        _, h, body = net.results(a)[0]
        assert h["width"] == width_byte(bits) and not h["flags"] & Flags.OVERFLOW
        assert list(body) == [30, 6, 0, 0]
    assert net.counters(SPINE)["overflows"] == 0


@pytest.mark.parametrize("cls", MODELS)
def test_a_parents_result_of_another_width_is_malformed(cls):
    net = TreeNet([2], cls=cls)
    for w in range(2):
        net.send(worker_addr(0, w), 0, [1, 1, 1, 1], width=8)
    leaf = net.switches[leaf_addr(0)]
    bad = pack([2, 2, 2, 2], type=MsgType.RESULT, job=net.cfg.job, seq=0,
               session=net.cfg.session, count=2, bitmap=1, width=width_byte(16))
    net.run(net.now + 0.0002)        # the leaf's DATA is up, the spine's RESULT not back
    before = leaf.counters["drop_malformed"]
    assert leaf.process(bad, SPINE, net.now) == []
    assert leaf.counters["drop_malformed"] == before + 1
