"""Issue 43: bounded mode rides out a stall. One rank of a bounded `ina train` run is
stopped for 4 s (SIGSTOP, then SIGCONT) mid-training; before, that rank ended the job
(AllreduceTooLate, exit 2, ~1,800 drop_stale); now it rejoins from a peer's replica and
the run finishes with bitwise identical replicas, reporting its dropped share.

A stopped rank whose peer went on more than 2 x window is answered STALE: it is behind
(its DATA would go on being too late) and rejoins, even though the RESULTs it missed
may wait in its receive buffer; the trigger has a fast test of its own.

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


# -- the trigger: the switch's STALE answer says "behind", whatever the rank has read ---
def _stale_answer_waiting(client, seq):
    """The switch's own ERROR (STALE) to this client's DATA of ``seq``, sent from the
    client's socket and left unread in it, as after a SIGCONT: the answer to a DATA the
    rank sent when it resumed, beside the RESULTs that came while it was stopped."""
    client._usock.sendto(pack(np.zeros(client.elements), job=client.job,
                              worker=client.worker, seq=seq, session=client.session),
                         client.switch)
    ready, _, _ = select.select([client._usock], [], [], 5.0)
    assert ready, "the switch did not answer the stale DATA"


def _pair(engine, ports):
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
    assert a.gsock is not None and b.gsock is not None, b.group_error
    for c in (a, b):        # the ranks rejoin (as under ina train) rather than end the job
        c.end_on_too_late = False
    return server, t, a, b


@pytest.mark.parametrize("engine", ENGINES)
def test_a_stale_answer_says_behind_whatever_the_rank_has_read(engine, ports):
    """A bounded rank stopped while its peer went on more than 2 x window finds, when it
    runs again, the RESULTs it missed waiting in its receive buffer (the group's copies)
    and the switch's STALE answer to the DATA it sent on resuming. It is behind: its
    DATA go on being too late (its peer's results leave it out) until it rejoins, so the
    call raises ``AllreduceTooLate`` whichever datagram it reads first, and also when the
    answer comes after the call that read its RESULT. Before, the compiled loop read the
    answer first (too late: a rejoin) and the Python loop the RESULT first (the answer
    dropped: the rank lagged on, its contributions lost); a call over before the answer
    came dropped it in both: the short stall test's intermittent "rejoins 0", and a
    stalled transformer rank that lagged on for the rest of its run (98.6% of the
    entries partial). An answer from before a rejoin is ignored."""
    server, t, a, b = _pair(engine, ports)
    try:
        # the peer goes on alone (b "stopped"): each slot closes at its deadline, and
        # its PARTIAL RESULT waits in b's group socket; the switch passes 2 x window
        for k in range(6):
            a.allreduce(np.full(600, 1 + k, np.float32))
        assert server.model.counters["partials"] >= 6
        _stale_answer_waiting(b, 0)
        with pytest.raises(AllreduceTooLate, match="has passed seq 0 "):
            b.allreduce(np.full(600, 100, np.float32))
        # the rank rejoins (its replica and position from the peer): both go on together
        b.start(b.session, a.seq)
        for k in range(6):      # ... until b stops again, and a goes on alone
            a.allreduce(np.full(600, 1 + k, np.float32))
        stopped_at = b.seq
        time.sleep(ERROR_INTERVAL)      # the switch answers one source this often
        # b resumes: its first call reads its RESULTs from its buffer and may end before
        # the switch's answer to its DATA comes; the answer then ends the next call
        with pytest.raises(AllreduceTooLate, match=f"has passed seq {stopped_at} "):
            for _ in range(2):
                b.allreduce(np.full(600, 100, np.float32))
                select.select([b._usock], [], [], 2.0)
        # after a rejoin, an answer to a DATA from before it is no news: ignored
        time.sleep(ERROR_INTERVAL)
        _stale_answer_waiting(b, stopped_at)
        b.start(b.session, a.seq)
        got = [None, None]

        def call(i, c):
            try:
                got[i] = c.allreduce(np.full(600, i + 1, np.float32))[0]
            except Exception as e:  # noqa: BLE001 (the test looks at it)
                got[i] = e
        ts = [threading.Thread(target=call, args=(i, c)) for i, c in enumerate((a, b))]
        for th in ts:
            th.start()
        for th in ts:
            th.join(10)
        assert all(isinstance(g, np.ndarray) for g in got), got
        # the same sum on both (3; on a loaded machine a slot may close at its 10 ms
        # deadline with one of them, and both apply that)
        assert np.array_equal(got[0], got[1]), got
    finally:
        a.close()
        b.close()
        server.stop()
        t.join(timeout=2)
        server.close()


def _stall_run(workload, steps, stall_s=4.0, past_recovery=True):
    """A bounded 2-rank ``run_training`` whose rank 1 is stopped for ``stall_s`` once
    training is under way, and on (``past_recovery``) until its peer is more than 2 x
    window ahead (the results the switch keeps: the DATA the rank sends on resuming
    are then answered STALE, and it rejoins)."""
    server = SwitchServer([], "127.0.0.1", 0)
    t = threading.Thread(target=server.serve_forever, kwargs={"install_signals": False},
                         daemon=True)
    t.start()
    log = {}
    # (on a loaded machine 4 s can be less than that: a clean-clone make test saw the
    # peer 232 results on, which the rank then read from its buffer)
    ahead = 2 * LINK_DEFAULTS["loopback"].window + 8 if past_recovery else 0

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
    # the peer went on during the stall (partial results), past the switch's store
    assert log["resumed_at_results"] - log["stopped_at_results"] > log["ahead"], log
    assert res.steps == steps and len(set(res.param_hashes)) == 1      # identical replicas
    if must_rejoin:                                                     # the stopped rank
        assert res.rejoin[1].get("rejoins", 0) >= 1, (res.rejoin, log)
    share = res.stats["entries_lost"] / res.stats["elements"]           # dropped share
    assert 0 < share < 1
    return share


def test_bounded_train_rides_out_a_4s_stall_short():
    """The digits CNN: the stopped rank reads the RESULTs waiting in its buffer, is told
    STALE, rejoins, and the run ends with identical replicas (before: it rejoined in 1
    of 3 clean-clone runs, 2 of 5 under load: the trigger's race)."""
    steps = 300
    res, log, counters = _stall_run("digits", steps)
    share = _check(res, log, counters, steps)
    print(f"dropped share {share:.3f}, rejoins {res.rejoin}, stall {log}, switch "
          f"drop_stale {counters['drop_stale']}")


@pytest.mark.skipif(not os.environ.get("INA_LONG"), reason="long tier (INA_LONG=1)")
def test_bounded_transformer_rides_out_a_4s_stall():
    """The issue's scenario as it was run: 4 s, however far the peer gets in that time
    (on a loaded machine less than 2 x window; the output says whether it rejoined)."""
    steps = 150
    res, log, counters = _stall_run("transformer", steps, past_recovery=False)
    share = _check(res, log, counters, steps, must_rejoin=False)
    print(f"dropped share {share:.3f}, rejoins {res.rejoin}, stall {log}, switch "
          f"drop_stale {counters['drop_stale']}")
