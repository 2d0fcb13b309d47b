"""The worker trusts only the switch, and only well-formed RESULTs of its own call.

Before: a worker applied any datagram that arrived on its port with a plausible seq
(replicas diverged by 1.7e10x the bound), an oversized RESULT crashed `allreduce` with a
numpy broadcast error, and a reliable worker accepted PARTIAL sums."""

import socket
import threading
import time

import numpy as np
import pytest

from ina_fabric.host.cluster import free_udp_ports
from ina_fabric.host.switch import SwitchModel
from ina_fabric.host.transport import SwitchClient
from ina_fabric.host.transport.switch_client import AllreduceInconsistent
from ina_fabric.protocol import unpack, MsgType, HEADER_BYTES
from ina_fabric.protocol.jobtable import JobConfig


class FakeNetworkSwitch:
    """The reference model on a UDP socket, with an attacker beside it: before each
    real RESULT, ``inject(result) -> [(sock, datagram)]`` datagrams go to the worker."""

    def __init__(self, job, inject=lambda result, sw, rogue: []):
        self.model = SwitchModel([job])
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.rogue = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rogue.bind(("127.0.0.1", 0))
        self.inject, self.running = inject, True
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def address(self):
        return self.sock.getsockname()

    def _serve(self):
        self.sock.settimeout(0.001)
        while self.running:
            try:
                data, src = self.sock.recvfrom(65536)
                replies = self.model.process(data, src, time.monotonic())
            except socket.timeout:
                replies = self.model.tick(time.monotonic())
            except OSError:
                return
            for dest, out in replies:
                for s, junk in self.inject(out, self.sock, self.rogue):
                    s.sendto(junk, dest)
                self.sock.sendto(out, dest)

    def close(self):
        self.running = False
        self.thread.join(2)
        self.sock.close()
        self.rogue.close()


def _client(sw, job, worker, **kw):
    return SwitchClient(sw.address, job.job, worker, job.n, job.window, job.elements,
                        job.mode, bind=job.members[worker].addr, deadline=job.deadline,
                        **kw)


def _ports(n):
    return free_udp_ports(n)


def test_spoofed_and_malformed_results_are_ignored():
    (port,) = _ports(1)
    job = JobConfig(4, (f"127.0.0.1:{port}",), window=4, elements=16)

    def inject(result, sw, rogue):
        hdr, elems = unpack(result)
        if hdr["type"] != MsgType.RESULT:
            return []
        forged = bytearray(result)
        forged[HEADER_BYTES:] = np.full(len(elems), 2 ** 30, ">i4").tobytes()
        oversized = result[:HEADER_BYTES] + bytes(result[HEADER_BYTES:]) * 3 + b"\0" * 4
        return [(rogue, bytes(forged)),          # right seq, from another port
                (sw, oversized)]                 # from the switch, wrong length
    sw = FakeNetworkSwitch(job, inject)
    try:
        with _client(sw, job, 0) as c:
            x = np.linspace(-1, 1, 200, dtype=np.float32)
            y, st = c.allreduce(x)
        assert np.abs(y - x).max() < 1e-3          # the worker's own sum (N = 1)
        assert st.foreign_ignored >= 2 * st.results
    finally:
        sw.close()


def test_reliable_worker_refuses_a_partial_result():
    w0, w1 = _ports(2)
    # the switch holds the job as bounded; the workers believe it is reliable
    job = JobConfig(5, (f"127.0.0.1:{w0}", f"127.0.0.1:{w1}"), window=2, elements=8,
                    deadline=0.002, mode="bounded")
    sw = FakeNetworkSwitch(job)
    try:
        import dataclasses
        reliable = dataclasses.replace(job, mode="reliable")
        with _client(sw, reliable, 0, stall_timeout=5.0) as c:   # worker 1 never sends
            with pytest.raises(AllreduceInconsistent, match="PARTIAL"):
                c.allreduce(np.ones(8, np.float32))
    finally:
        sw.close()
