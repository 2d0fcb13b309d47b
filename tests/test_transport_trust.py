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
from ina_fabric.host.transport.switch_client import AllreduceInconsistent, AllreduceTooLate
from ina_fabric.protocol import unpack, MsgType, HEADER_BYTES
from ina_fabric.protocol.fields import field_offsets
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
                        session=job.session, **kw)


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
        other_run = bytearray(forged)
        other_run[field_offsets()["session"]] ^= 0x80
        return [(rogue, bytes(forged)),          # right seq, from another port
                (sw, oversized),                 # from the switch, wrong length
                (sw, bytes(other_run))]          # from the switch, another session
    sw = FakeNetworkSwitch(job, inject)
    try:
        with _client(sw, job, 0) as c:
            x = np.linspace(-1, 1, 200, dtype=np.float32)
            y, st = c.allreduce(x)
        assert np.abs(y - x).max() < 1e-3          # the worker's own sum (N = 1)
        assert st.foreign_ignored >= 3 * st.results
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


@pytest.mark.parametrize("engine", ["python", "c"])
@pytest.mark.parametrize("after", ["restart", "another_run"])
def test_bounded_workers_raise_when_the_switch_loses_their_job(engine, after):
    """The switch restarts (its job table is empty) or another run installs the job id
    under its own session: every bounded worker raises within its give-up time, naming
    the cause. Since issue 43 the switch answers such DATA with an ERROR (UNKNOWN_JOB,
    BAD_SESSION), so the error is SwitchRefused with the switch's reason (before, the
    client only saw its results go missing: AllreduceTooLate, "no longer has it").
    Before issue 17, bounded ranks zero-filled every slot with no error."""
    from ina_fabric.host.transport.switch_client import SwitchRefused
    from ina_fabric.host.transport import fastcall
    if engine == "c" and not fastcall.available():
        pytest.skip(fastcall.WHY_NOT)
    w0, w1 = _ports(2)
    job = JobConfig(6, (f"127.0.0.1:{w0}", f"127.0.0.1:{w1}"), window=4, elements=8,
                    deadline=0.2, mode="bounded")
    sw = FakeNetworkSwitch(job)
    errors, outs = {}, {}
    clients = [_client(sw, job, w, engine=engine) for w in range(2)]

    def call(w):
        try:
            outs[w] = clients[w].allreduce(np.full(64, w + 1.0, np.float32))[0]
        except Exception as e:  # noqa: BLE001 (checked below)
            errors[w] = e

    def both():
        ts = [threading.Thread(target=call, args=(w,)) for w in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
    try:
        both()
        assert not errors and np.array_equal(outs[0], outs[1])    # (partial under load)
        if after == "restart":
            sw.model = SwitchModel()
        else:
            import dataclasses
            sw.model = SwitchModel([dataclasses.replace(job, session=job.session ^ 1)])
        outs.clear()
        t0 = time.monotonic()
        both()
        took = time.monotonic() - t0
        assert sorted(errors) == [0, 1] and not outs, (errors, outs)
        why = "has no job 6" if after == "restart" else "holds job 6 under another session"
        for e in errors.values():
            assert isinstance(e, SwitchRefused), e
            assert why in str(e), e
        assert took < 10 * clients[0].giveup + 5
    finally:
        for c in clients:
            c.close()
        sw.close()


@pytest.mark.parametrize("engine", ["python", "c"])
def test_a_bounded_lagger_ends_the_job_so_every_rank_raises(engine, monkeypatch):
    """Bounded mode, one worker stalls until the switch has reused the slots of its
    call, and the RESULTs it missed are lost: it raises AllreduceTooLate (never applies its own zeros) and ends the job at
    the switch, so the other workers' next call raises too instead of carrying on
    without it; every later call of any of them raises JobFailed. Before, the lagger
    raised alone and the others went on as if nothing had happened."""
    import secrets
    from ina_fabric.host.transport import fastcall
    from ina_fabric.host.transport.switch_client import JobFailed
    if engine == "c" and not fastcall.available():
        pytest.skip(fastcall.WHY_NOT)
    key = secrets.token_bytes(32)
    monkeypatch.setenv("INA_SWITCH_KEY", key.hex())
    ports = _ports(3)
    job = JobConfig(7, tuple(f"127.0.0.1:{p}" for p in ports), window=4, elements=8,
                    deadline=0.05, mode="bounded")
    sw = FakeNetworkSwitch(job)
    sw.model = SwitchModel([job], key=key)
    clients = [_client(sw, job, w, engine=engine) for w in range(3)]
    errors, outs = {}, {}

    def call(w, tag):
        try:
            outs[(w, tag)] = clients[w].allreduce(np.full(64, w + 1.0, np.float32))[0]
        except Exception as e:  # noqa: BLE001 (checked below)
            errors[(w, tag)] = e

    def run(ws, tag):
        ts = [threading.Thread(target=call, args=(w, tag)) for w in ws]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
    try:
        run([0, 1, 2], "first")
        assert not errors, errors
        assert all(np.array_equal(outs[(0, "first")], outs[(w, "first")]) for w in (1, 2))
        for k in range(3):          # worker 2 stalls: the others go on without it
            run([0, 1], f"ahead{k}")
        assert not errors, errors
        while True:                 # the RESULTs it missed are lost on its link (else
            try:                    # it takes them from its socket: the others' values)
                clients[2]._usock.recv(65536)
            except BlockingIOError:
                break
        t0 = time.monotonic()
        run([2], "late")            # its slots were reused long ago
        assert isinstance(errors.get((2, "late")), AllreduceTooLate), errors
        # the error says how far behind a worker may fall, and what gives more room
        assert "datagrams behind the others" in str(errors[(2, "late")])
        assert "a larger job window" in str(errors[(2, "late")])
        assert (2, "late") not in outs
        run([0, 1], "next")         # the job is gone: both raise, within the bound (the
        took = time.monotonic() - t0    # switch's ERROR, issue 43, or its STATUS names it)
        for w in (0, 1):
            e = errors.get((w, "next"))
            assert isinstance(e, OSError) and ("has no job 7" in str(e) or
                                               "no longer holds job 7" in str(e)), errors
        assert took < 10 * clients[0].giveup + 10
        for w in range(3):          # and nobody calls on a broken job again
            with pytest.raises(JobFailed, match="an earlier call failed"):
                clients[w].allreduce(np.ones(8, np.float32))
        assert 7 not in sw.model.jobs and sw.model.counters["control"] >= 1
    finally:
        for c in clients:
            c.close()
        sw.close()
