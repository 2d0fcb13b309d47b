"""Sending in runs (docs/congestion.md, "Sending in runs"): the compiled client loop
(once its calls are fast, or always with ``gso="on"``) and the switch's fast engine send
a run of datagrams of one length to one destination as one send with UDP_SEGMENT
(generic segmentation offload), and the kernel cuts it into those datagrams. A receiver with UDP_GRO is handed such a send whole, with its segment
size, so these tests see exactly how the datagrams were sent; every other receiver gets
the datagrams one by one, as before."""

import socket
import threading

import numpy as np
import pytest

from ina_fabric.host.switch import fast
from ina_fabric.host.transport import fastcall
from ina_fabric.protocol import pack
from ina_fabric.protocol.fields import HEADER_BYTES, MsgType
from ina_fabric.protocol.jobtable import JobConfig

UDP_GRO = 104            # linux/udp.h: receive a GSO send whole, with its segment size


def _gro_socket():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_UDP, UDP_GRO, 1)
    s.bind(("127.0.0.1", 0))
    s.settimeout(3.0)
    return s


def _receive(s, quiet=0.3):
    """[(bytes, segment size or None)] until nothing comes for ``quiet`` seconds."""
    got = []
    while True:
        try:
            d, anc, _, _ = s.recvmsg(1 << 16, socket.CMSG_SPACE(4))
        except TimeoutError:
            return got
        seg = None
        for level, kind, data in anc:
            if level == socket.IPPROTO_UDP and kind == UDP_GRO:
                seg = int.from_bytes(data[:2], "little")
        got.append((d, seg))
        s.settimeout(quiet)


def _split(sends):
    """The datagrams of the sends, cut at each send's segment size."""
    out = []
    for d, seg in sends:
        step = seg or len(d)
        out += [d[i:i + step] for i in range(0, len(d), step)]
    return out


@pytest.mark.skipif(not fastcall.available(), reason=fastcall.WHY_NOT or "no C loop")
@pytest.mark.parametrize("gso", ["on", "off"])
def test_the_client_sends_its_window_in_runs(gso):
    from ina_fabric.host.transport.switch_client import SwitchClient, SwitchUnavailable
    sw = _gro_socket()
    c = SwitchClient(sw.getsockname(), 3, 0, 1, bind=("127.0.0.1", 0), elements=256,
                     window=16, engine="c", connect_timeout=0.5, gso=gso, session=5)
    err = []

    def call():
        try:
            c.allreduce(np.ones(256 * 16, np.float32))
        except SwitchUnavailable as e:
            err.append(e)

    t = threading.Thread(target=call, daemon=True)
    try:
        t.start()
        sends = _receive(sw)
        t.join(5)
        assert err, "the call against a silent switch did not end"
        dgrams = _split(sends)
        # the call's first window (its exponents' DATA: a silent switch never lets it
        # further), then the window's re-sends: whole DATA of the job, of one length
        assert len(dgrams) >= 16 and len({len(d) for d in dgrams}) == 1
        assert all(d[1] == MsgType.DATA and d[0] == sends[0][0][0] for d in dgrams)
        runs = [(d, seg) for d, seg in sends if seg]
        if gso == "on":   # the window went out in runs of 4, each cut at a datagram's length
            assert runs and all(seg == len(dgrams[0]) for _, seg in runs)
            assert max(len(d) // seg for d, seg in runs) == 4   # _client.c GSO_MAX_SEGS
            assert len(sends) < len(dgrams)
        else:
            assert not runs and len(sends) == len(dgrams)
    finally:
        c.close()
        sw.close()


@pytest.mark.skipif(not fast.available(), reason=fast.WHY_NOT or "no engine")
@pytest.mark.parametrize("gso", [True, False])
def test_the_switch_sends_a_batch_of_results_to_one_worker_in_one_run(gso):
    from ina_fabric.host.switch import SwitchServer
    w = _gro_socket()
    member = f"127.0.0.1:{w.getsockname()[1]}"
    server = SwitchServer([JobConfig(1, (member,), window=16, elements=64, session=9)],
                          "127.0.0.1", 0, key=None, engine="fast", gso=gso)
    # eight DATA wait in the switch's socket before it reads: one batch, eight RESULTs
    for seq in range(8):
        w.sendto(pack(np.full(64, seq, np.int64), job=1, worker=0, seq=seq, session=9),
                 server.address)
    t = threading.Thread(target=server.serve_forever, args=(False,), daemon=True)
    t.start()
    try:
        sends = _receive(w)
        results = _split(sends)
        assert [np.frombuffer(d[HEADER_BYTES:], ">i4")[0] for d in results] == list(range(8))
        assert all(d[1] == MsgType.RESULT for d in results)
        if gso:
            assert len(sends) == 1 and sends[0][1] == HEADER_BYTES + 4 * 64
        else:
            assert len(sends) == 8 and not any(seg for _, seg in sends)
    finally:
        server.stop()
        t.join(2)
        server.close()
        w.close()


def test_auto_sends_in_runs_once_the_calls_are_fast():
    """``gso="auto"`` (the default): runs once a call long enough to say sent at
    GSO_MIN_RATE or more; a slow call turns them off again; "on" and "off" hold."""
    from ina_fabric.host.transport.switch_client import (AllreduceStats, SwitchClient,
                                                         GSO_MIN_RATE, RATE_MIN_PACKETS)
    c = SwitchClient(("127.0.0.1", 9), 1, 0, 2, bind=("127.0.0.1", 0))
    try:
        dgram = HEADER_BYTES + 4 * c.elements
        assert c.gso == "auto" and not c.sends_in_runs          # no rate known yet
        c._account(AllreduceStats(packets_sent=1000, seconds=1000 * dgram / 125e6), 32)
        assert c.sends_in_runs                                   # 1 Gbit/s
        c._account(AllreduceStats(packets_sent=RATE_MIN_PACKETS - 1, seconds=1.0), 32)
        assert c.sends_in_runs                                   # too short to say
        c._account(AllreduceStats(packets_sent=1000, seconds=1000 * dgram / 12.5e6), 32)
        assert not c.sends_in_runs and 12.5e6 < GSO_MIN_RATE     # 100 Mbit/s
        c.gso = "on"
        assert c.sends_in_runs
    finally:
        c.close()
    with pytest.raises(ValueError, match="gso 'yes'"):
        SwitchClient(("127.0.0.1", 9), 1, 0, 2, bind=("127.0.0.1", 0), gso="yes")


def test_ina_gso_picks_the_rule():
    from ina_fabric.host.ddp.hook import hook_settings
    env = {"INA_SWITCH": "127.0.0.1:19900"}
    assert hook_settings(env).gso == "auto"
    assert hook_settings({**env, "INA_GSO": "off"}).gso == "off"
    with pytest.raises(ValueError, match="INA_GSO='sometimes'"):
        hook_settings({**env, "INA_GSO": "sometimes"})
