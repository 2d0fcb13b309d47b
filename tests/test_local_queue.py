"""A worker's share of its host's own queue (issue 39, ``sockbuf.local_queue_bytes``):
the send buffer bounds the datagrams a worker keeps in its interface's queue, as TCP
small queues bound a TCP flow's. The lab's behaviour (no refused sends on a quiet link;
its share beside a flood and beside TCP) is in tests/test_lab_bench.py and the benches."""

import socket

import pytest

from ina_fabric.host.transport.sockbuf import (local_queue_bytes, LOCAL_QUEUE_MIN,
                                               LOCAL_QUEUE_MAX, LOCAL_QUEUE_S)
from ina_fabric.host.transport.switch_client import SwitchClient


def test_the_share_is_tcps_two_segments_or_a_millisecond_of_the_rate():
    assert local_queue_bytes(None) == LOCAL_QUEUE_MIN == 128 << 10
    assert local_queue_bytes(0.0) == LOCAL_QUEUE_MIN
    assert local_queue_bytes(12.5e6) == LOCAL_QUEUE_MIN          # 100 Mbit/s: 12.5 KB
    assert local_queue_bytes(1.25e9) == int(1.25e9 * LOCAL_QUEUE_S)   # 10 Gbit/s: 1.25 MB
    assert local_queue_bytes(1e12) == LOCAL_QUEUE_MAX


def _sndbuf(c):
    # the kernel doubles what was asked for its own overhead
    return c._usock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2


def test_a_client_sizes_its_send_buffer_for_the_rate_it_sent_at():
    from ina_fabric.host.transport.switch_client import AllreduceStats, RATE_MIN_PACKETS
    from ina_fabric.protocol.fields import HEADER_BYTES
    c = SwitchClient(("127.0.0.1", 9), 1, 0, 2, bind=("127.0.0.1", 0))
    try:
        # before: an 8 MB buffer, a whole window in the host's queue
        assert _sndbuf(c) == LOCAL_QUEUE_MIN
        dgram = HEADER_BYTES + 4 * c.elements
        # 10 Gbit/s: 1.25 GB/s sent, 2 ms of it
        fast = AllreduceStats(packets_sent=100_000, seconds=100_000 * dgram / 1.25e9)
        c._account(fast, 32)
        assert c._sndbuf == local_queue_bytes(1.25e9) > LOCAL_QUEUE_MIN
        assert _sndbuf(c) == c._sndbuf and c.total.packets_sent == 100_000
        # a call too short to say: the buffer stays
        c._account(AllreduceStats(packets_sent=RATE_MIN_PACKETS - 1, seconds=1.0), 32)
        assert _sndbuf(c) == local_queue_bytes(1.25e9)
        # 100 Mbit/s: back to the floor
        c._account(AllreduceStats(packets_sent=1000, seconds=1000 * dgram / 12.5e6), 32)
        assert _sndbuf(c) == LOCAL_QUEUE_MIN
    finally:
        c.close()


def test_ina_engine_picks_the_call_loop():
    from ina_fabric.host.ddp.hook import hook_settings
    env = {"INA_SWITCH": "127.0.0.1:19900"}
    assert hook_settings(env).engine == "auto"
    env["INA_ENGINE"] = "python"
    assert hook_settings(env).engine == "python"
    env["INA_ENGINE"] = "fortran"
    with pytest.raises(ValueError, match="INA_ENGINE='fortran'") as e:
        hook_settings(env)
    assert "\n" not in str(e.value)


def test_a_fixed_local_queue_is_kept():
    from ina_fabric.host.transport.switch_client import AllreduceStats
    from ina_fabric.host.ddp.hook import hook_settings
    c = SwitchClient(("127.0.0.1", 9), 1, 0, 2, bind=("127.0.0.1", 0), local_queue=1 << 20)
    try:
        assert _sndbuf(c) == 1 << 20
        c._account(AllreduceStats(packets_sent=1000, seconds=10.0), 32)
        assert _sndbuf(c) == 1 << 20
    finally:
        c.close()
    with pytest.raises(ValueError, match="local_queue 100"):
        SwitchClient(("127.0.0.1", 9), 1, 0, 2, bind=("127.0.0.1", 0), local_queue=100)
    env = {"INA_SWITCH": "127.0.0.1:19900"}
    assert hook_settings(env).local_queue is None
    env["INA_LOCAL_QUEUE"] = str(8 << 20)
    assert hook_settings(env).local_queue == 8 << 20
    env["INA_LOCAL_QUEUE"] = "lots"
    with pytest.raises(ValueError, match="INA_LOCAL_QUEUE='lots'"):
        hook_settings(env)
