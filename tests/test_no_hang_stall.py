"""Issue 43: bounded mode rides out a stall. One rank of a bounded `ina train` run is
stopped for 4 s (SIGSTOP, then SIGCONT) mid-training; before, that rank ended the job
(AllreduceTooLate, exit 2, ~1,800 drop_stale); now it rejoins from a peer's replica and
the run finishes with bitwise identical replicas, reporting its dropped share.

A stopped rank needs no rejoin when every RESULT it missed still waits in its receive
buffer or in the switch's store: it reads them, exactly what its peer applied. The
tests stall it past both, so it must rejoin; the trigger itself (a STALE answer ends a
call only for a result this worker lacks) has a fast test of its own.

The default suite runs the short version (digits); INA_LONG=1 adds the issue's own
scenario (the transformer workload)."""

import multiprocessing as mp
import os
import select
import signal
import threading
import time

import numpy as np
import pytest

from ina_fabric.host.switch import SwitchServer
from ina_fabric.host.ddp.train import TrainConfig, run_training
from ina_fabric.host.transport import fastcall
from ina_fabric.host.transport.switch_client import SwitchClient, AllreduceTooLate
from ina_fabric.protocol import pack
from ina_fabric.protocol.fields import ERROR_INTERVAL
from ina_fabric.protocol.jobtable import JobConfig, LINK_DEFAULTS, loopback_group

ENGINES = ["python"] + (["c"] if fastcall.available() else [])


# -- the trigger: a STALE answer is "too late" only for a result this worker lacks -----
def _stale_answer_waiting(client, seq):
    """The switch's own ERROR (STALE) to this client's DATA of ``seq``, sent from the
    client's socket and left unread in it, as after a SIGCONT: the answer to a DATA the
    rank sent when it resumed, beside the RESULTs that came while it was stopped."""
    client._usock.sendto(pack(np.zeros(client.elements), job=client.job,
                              worker=client.worker, seq=seq, session=client.session),
                         client.switch)
    ready, _, _ = select.select([client._usock], [], [], 5.0)
    assert ready, "the switch did not answer the stale DATA"


@pytest.mark.parametrize("engine", ENGINES)
def test_results_waiting_in_the_buffer_beat_a_stale_answer(engine, ports):
    """A bounded rank stopped while its peer went on finds, when it runs again, every
    RESULT it missed waiting in its receive buffer (the group's copies) and, on its
    unicast socket, the switch's STALE answer to the DATA it sent on resuming. It reads
    the RESULTs: each is exactly what its peer applied. Before, the compiled loop read
    the unicast socket first and took the STALE answer as ``AllreduceTooLate`` although
    the result was in its own buffer: whether a stalled rank rejoined or rode out the
    stall depended on which datagram it read first (the short stall test's intermittent
    "rejoins 0" under load). A result that is really gone still ends the call at once."""
    p = ports(2)
    server = SwitchServer([], "127.0.0.1", 0, engine="model")
    t = threading.Thread(target=server.serve_forever, kwargs={"install_signals": False},
                         daemon=True)
    t.start()
    group = loopback_group(server.address, 1)
    job = JobConfig(1, tuple(f"127.0.0.1:{q}" for q in p), window=4, elements=256,
                    mode="bounded", deadline=0.01, mcast=group, session=0x4343)
    server.model.add_job(job)
    a, b = (SwitchClient(("127.0.0.1", server.address[1]), 1, i, 2, window=4,
                         elements=256, mode="bounded", deadline=0.01, group=group,
                         session=job.session, bind=("127.0.0.1", p[i]), engine=engine)
            for i in range(2))
    try:
        assert a.gsock is not None and b.gsock is not None, b.group_error
        # the peer goes on alone (b "stopped"): each slot closes at its deadline, and
        # its PARTIAL RESULT waits in b's group socket; the switch passes 2 x window
        ours = [a.allreduce(np.full(600, 1 + k, np.float32))[0] for k in range(6)]
        assert server.model.counters["partials"] >= 6
        _stale_answer_waiting(b, 0)
        for k in range(6):     # b resumes: every result it missed, from its buffer
            got, st = b.allreduce(np.full(600, 100 + k, np.float32))
            assert np.array_equal(got, ours[k]), k
        assert b.seq == a.seq
        # a result that is gone (read away here, as a full buffer drops it) while the
        # switch answers STALE: too late, at once (no wait for the give-up time)
        for _ in range(4):      # past 2 x window: the switch no longer holds b's next
            a.allreduce(np.full(600, 7, np.float32))
        while select.select([b.gsock], [], [], 0.2)[0]:
            b.gsock.recv(1 << 16)
        time.sleep(ERROR_INTERVAL)      # the switch answers one source this often
        _stale_answer_waiting(b, b.seq)
        t0 = time.monotonic()
        with pytest.raises(AllreduceTooLate, match="has passed seq"):
            b.allreduce(np.full(600, 9, np.float32))
        assert time.monotonic() - t0 < 1.0
    finally:
        a.close()
        b.close()
        server.stop()
        t.join(timeout=2)
        server.close()

pytestmark = pytest.mark.xdist_group("torch")


def _recoverable(rcvbuf, window):
    """RESULTs a stopped bounded rank can still get without a rejoin: those its receive
    buffer holds (the group's copies that came while it was stopped: fewer than twice
    ``rcvbuf`` in 65,500-byte datagrams, as the kernel doubles the size asked for and
    counts each datagram with its overhead; 1 MiB held 31) and the switch's last 2 x
    window (re-sent to a late DATA)."""
    return 2 * window + 2 * rcvbuf // 65_500


def _stall_run(workload, steps, stall_s=4.0, past_recovery=True):
    """A bounded 2-rank ``run_training`` whose rank 1 is stopped for ``stall_s`` once
    training is under way, and on (``past_recovery``) until its peer is further ahead
    than it can recover without a rejoin."""
    from ina_fabric.host.transport import switch_client
    server = SwitchServer([], "127.0.0.1", 0)
    t = threading.Thread(target=server.serve_forever, kwargs={"install_signals": False},
                         daemon=True)
    t.start()
    log = {}
    # the peer must get further ahead than the stopped rank can recover without a
    # rejoin (its buffer, then the switch's store): before, the short test ended the
    # stall two windows ahead, inside the 64 MiB buffer, and the rank rejoined only when
    # it read the switch's STALE answer before the RESULTs waiting for it (a race)
    ahead = _recoverable(switch_client.WORKER_RCVBUF, LINK_DEFAULTS["loopback"].window) \
        + 8 if past_recovery else 0

    def staller():          # once training is under way: rank 1 stops for stall_s
        while server.model.counters["results"] < 20:
            time.sleep(0.02)
        pid = next(p.pid for p in mp.active_children() if p.name == "ina-rank-1")
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        stopped = log["stopped_at_results"] = server.model.counters["results"]
        time.sleep(stall_s)
        while server.model.counters["results"] - stopped <= ahead and \
                time.monotonic() < t0 + 120:
            time.sleep(0.05)
        log["stall_s"] = time.monotonic() - t0
        os.kill(pid, signal.SIGCONT)
        log["resumed_at_results"] = server.model.counters["results"]

    th = threading.Thread(target=staller, daemon=True)
    th.start()
    try:
        res = run_training(TrainConfig(backend="ina-bounded", workload=workload, workers=2,
                                       switch=f"127.0.0.1:{server.address[1]}",
                                       max_steps=steps, stop_at_target=False,
                                       elements=16368))
    finally:
        server.stop()
        t.join(timeout=2)
        counters = dict(server.model.counters)
        server.close()
    th.join(timeout=1)
    log["ahead"] = ahead
    return res, log, counters


def _check(res, log, counters, steps, must_rejoin=True):
    assert "resumed_at_results" in log, "the stall came after the run"
    # the peer went on during the stall (partial results), past all the stopped rank
    # could recover without a rejoin
    assert log["resumed_at_results"] - log["stopped_at_results"] > log["ahead"], log
    assert res.steps == steps and len(set(res.param_hashes)) == 1      # identical replicas
    if must_rejoin:                                                     # the stopped rank
        assert res.rejoin[1].get("rejoins", 0) >= 1, (res.rejoin, log)
    share = res.stats["entries_lost"] / res.stats["elements"]           # dropped share
    assert 0 < share < 1
    return share


def test_bounded_train_rides_out_a_4s_stall_short(monkeypatch):
    """The digits CNN sends 4 datagrams a step where the transformer sends 67: its ranks'
    receive buffers are scaled down alike (1 MiB, ~31 RESULTs), so that a 4 s stall
    outlasts them as the issue's did (forked ranks inherit the setting)."""
    from ina_fabric.host.transport import switch_client
    monkeypatch.setattr(switch_client, "WORKER_RCVBUF", 1 << 20)
    steps = 300
    res, log, counters = _stall_run("digits", steps)
    share = _check(res, log, counters, steps)
    print(f"dropped share {share:.3f}, rejoins {res.rejoin}, stall {log}, switch "
          f"drop_stale {counters['drop_stale']}")


@pytest.mark.skipif(not os.environ.get("INA_LONG"), reason="long tier (INA_LONG=1)")
def test_bounded_transformer_rides_out_a_4s_stall():
    """The issue's scenario as it was run: 4 s, with the ranks' 64 MiB receive buffers.
    The stopped rank reads what they hold and rejoins only if its peer got further (the
    output says which)."""
    steps = 150
    res, log, counters = _stall_run("transformer", steps, past_recovery=False)
    share = _check(res, log, counters, steps, must_rejoin=False)
    print(f"dropped share {share:.3f}, rejoins {res.rejoin}, stall {log}, switch "
          f"drop_stale {counters['drop_stale']}")
