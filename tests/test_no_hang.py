"""Issue 43: no hang, no silent fallback. Every mismatch a user can make between the
switch's job and the workers raises within seconds on every rank, naming the cause; the
switch answers DATA it refuses for a fixable reason with an ERROR that is never larger
than the DATA (``fields.Refusal``)."""

import random
import socket
import threading
import time

import numpy as np
import pytest

from ina_fabric.host.switch import SwitchModel, SwitchServer
from ina_fabric.host.switch import fast
from ina_fabric.host.transport.switch_client import (SwitchClient, SwitchRefused,
                                                     AllreduceInconsistent, JobFailed)
from ina_fabric.protocol import pack, unpack, MsgType, HEADER_BYTES
from ina_fabric.protocol.fields import Refusal, ERROR_INTERVAL
from ina_fabric.protocol.jobtable import JobConfig

ENGINES = ["python"] + (["c"] if __import__(
    "ina_fabric.host.transport.fastcall", fromlist=["x"]).available() else [])
SWITCHES = ["model"] + (["fast"] if fast.available() else [])


# -- the reference model and the C engine agree on every refusal ---------------------
def test_refusals_engine_matches_model():
    """Random DATA, good and refusable (unknown job, another session, not a member,
    too long, stale, a short packet in an open slot), from several sources at random
    times: the compiled engine answers exactly as the model (datagrams and counters)."""
    if not fast.available():
        pytest.skip(fast.WHY_NOT)
    rng = random.Random(43)
    addrs = [("127.0.0.1", 5000 + i) for i in range(3)] + [("10.0.0.9", 7000)]
    job = JobConfig(1, tuple(f"{a}:{p}" for a, p in addrs[:3]), window=4, elements=8,
                    mode="bounded", deadline=0.01, session=0x43)
    m, f = SwitchModel([job]), fast.FastSwitchModel([job])
    now, seqs = 0.0, [0, 0, 0]
    for _ in range(3000):
        now += rng.choice([0.0, 0.001, 0.03, 0.2])
        src = rng.randrange(4)
        w = min(src, 2) if rng.random() < 0.9 else rng.randrange(8)
        kind = rng.random()
        seq = seqs[w % 3]
        if kind < 0.6:
            seqs[w % 3] += 1
        elif kind < 0.75:
            seq = max(0, seq - rng.randrange(1, 20))          # behind: stale
        nel = 8 if rng.random() < 0.85 else rng.choice([0, 3, 9, 12])
        d = pack(np.arange(nel), job=1 if rng.random() < 0.9 else 2, worker=w, seq=seq,
                 session=0x43 if rng.random() < 0.95 else 0x44)
        assert m.process(d, addrs[src], now) == f.process(d, addrs[src], now)
    assert m.counters == f.counters
    assert m.counters["errors_sent"] > 50 and m.counters["errors_limited"] > 50
    assert m.status()["jobs"][1]["position"] == f.status()["jobs"][1]["position"] > 0


# -- no amplifier --------------------------------------------------------------------
@pytest.mark.parametrize("engine", SWITCHES)
def test_flood_of_wrong_length_data_gets_fewer_bytes_back(engine, ports):
    """A flood of DATA too long for the job (and of header-only DATA for a job that
    does not exist) gets back fewer bytes than it sent: every ERROR is 28 bytes, no
    larger than its request, and one source is answered at most once per
    ERROR_INTERVAL."""
    w0, w1 = ports(2)
    job = JobConfig(3, (f"127.0.0.1:{w0}", f"127.0.0.1:{w1}"), window=4, elements=4,
                    session=0x43)
    server = SwitchServer([job], "127.0.0.1", 0, engine=engine, key=None)
    t = threading.Thread(target=server.serve_forever, kwargs={"install_signals": False},
                         daemon=True)
    t.start()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", w0))
    s.setblocking(False)
    sent = got = replies = 0
    small = []
    try:
        long_ = pack(np.ones(64), job=3, worker=0, seq=0, session=0x43)   # 284 bytes
        tiny = pack(np.ones(0), job=9, worker=0, seq=0, session=0x43)     # 28 bytes
        t0 = time.monotonic()
        for i in range(4000):
            d = long_ if i % 2 else tiny
            try:
                s.sendto(d, server.address)
                sent += len(d)
            except BlockingIOError:
                pass
            try:
                while True:
                    r = s.recv(65536)
                    got += len(r)
                    replies += 1
                    small.append(len(r))
            except BlockingIOError:
                pass
        elapsed = time.monotonic() - t0
        time.sleep(0.2)
        try:
            while True:
                r = s.recv(65536)
                got += len(r)
                replies += 1
                small.append(len(r))
        except BlockingIOError:
            pass
    finally:
        server.stop()
        t.join(timeout=2)
        counters = server.model.counters
        server.close()
        s.close()
    assert replies >= 1 and set(small) == {HEADER_BYTES}
    assert replies <= elapsed / ERROR_INTERVAL + 3
    assert got * 10 < sent
    assert counters["errors_sent"] == replies
    assert counters["drop_malformed"] + counters["drop_unknown_job"] > 1000


# -- every mismatch raises within 5 s on every rank, naming the cause -------------------
def _serve(jobs, engine="fast"):
    """A switch in a thread, with the machine's control key (STATUS answered)."""
    server = SwitchServer(jobs, "127.0.0.1", 0, engine=engine if engine in SWITCHES
                          else "model")
    t = threading.Thread(target=server.serve_forever, kwargs={"install_signals": False},
                         daemon=True)
    t.start()
    return server, t


def _ranks(clients, size=40_000, calls=1):
    """Run one allreduce per client in threads; returns [(result or exception, s)]."""
    out = [None] * len(clients)

    def one(i, c):
        t0 = time.monotonic()
        try:
            for _ in range(calls):
                r, _ = c.allreduce(np.full(size, i + 1, np.float32))
            out[i] = (r, time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 (the test looks at it)
            out[i] = (e, time.monotonic() - t0)

    ts = [threading.Thread(target=one, args=(i, c), daemon=True)
          for i, c in enumerate(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return out


def _clients(ports_, job, n, engine, **kw):
    kw = {"elements": job.elements, "window": job.window, "session": job.session} | kw
    job_id = kw.pop("job_id", job.job)
    return [SwitchClient(("127.0.0.1", SWITCH[0]), job_id, i, n,
                         bind=("127.0.0.1", ports_[i]), engine=engine, **kw)
            for i in range(n)]


SWITCH = [0]


@pytest.fixture
def switch_of():
    made = []

    def make(jobs):
        server, t = _serve(jobs)
        made.append((server, t))
        SWITCH[0] = server.address[1]
        return server
    yield make
    for server, t in made:
        server.stop()
        t.join(timeout=2)
        server.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_element_count_mismatch_raises_at_once(engine, ports, switch_of):
    """`ina switch --local-workers 2` (256 elements) against clients with 16,368 (the
    loopback default of `ina allreduce --switch`): before, a 30 s stall ending in
    AllreduceTimeout "65 of 81 packets outstanding"; now every rank raises the switch's
    reason within 5 s."""
    p = ports(2)
    job = JobConfig(1, tuple(f"127.0.0.1:{q}" for q in p), elements=256, session=0x431)
    switch_of([job])
    res = _ranks(_clients(p, job, 2, engine, elements=16368, stall_timeout=30.0))
    for e, secs in res:
        assert isinstance(e, SwitchRefused) and e.reason == Refusal.BAD_LENGTH, e
        assert secs < 5 and "256 elements" in str(e) and "\n" not in str(e)


@pytest.mark.parametrize("engine", ENGINES)
def test_wrong_job_id_names_it(engine, ports, switch_of):
    """A job id the switch does not hold: "no job 7" within 5 s on every rank (before:
    SwitchUnavailable after connect_timeout, as if the switch were down)."""
    p = ports(2)
    job = JobConfig(1, tuple(f"127.0.0.1:{q}" for q in p), elements=256, session=0x432)
    switch_of([job])
    res = _ranks(_clients(p, job, 2, engine, job_id=7, connect_timeout=10.0))
    for e, secs in res:
        assert isinstance(e, SwitchRefused) and e.reason == Refusal.UNKNOWN_JOB, e
        assert secs < 5 and "has no job 7" in str(e)


@pytest.mark.parametrize("engine", ENGINES)
def test_more_workers_than_the_job_has_members(engine, ports, switch_of):
    """4 workers against a 2-member job: ranks 2-3 are no members (NOT_MEMBER), ranks
    0-1 get complete results of 2 workers (before: they went on with sums scaled by
    4/2, and ranks 2-3 hung until their timeout). Every rank raises within 5 s."""
    p = ports(4)
    job = JobConfig(1, tuple(f"127.0.0.1:{q}" for q in p[:2]), elements=256,
                    session=0x433)
    switch_of([job])
    res = _ranks(_clients(p, job, 4, engine, connect_timeout=10.0, stall_timeout=30.0))
    for i, (e, secs) in enumerate(res):
        assert secs < 5, (i, e)
        if i < 2:
            assert isinstance(e, AllreduceInconsistent) and "2 member(s)" in str(e), e
        else:
            assert isinstance(e, SwitchRefused) and e.reason == Refusal.NOT_MEMBER, e


@pytest.mark.parametrize("engine", ENGINES)
def test_client_reused_under_a_new_session(engine, ports, switch_of):
    """The job installed again under a new session (slots afresh): the same clients,
    given the new session, start their sequence at 0 and forget an earlier failure
    (before: they kept their seq and stalled, "96 of 96 packets outstanding")."""
    p = ports(2)
    job = JobConfig(1, tuple(f"127.0.0.1:{q}" for q in p), elements=256, session=0x434)
    server = switch_of([job])
    cs = _clients(p, job, 2, engine, stall_timeout=3.0)
    for r, _ in _ranks(cs, calls=2):
        assert np.all(r == 3)
    cs[0].failed = (job.session, "AllreduceTimeout")        # as after a failed call
    with pytest.raises(JobFailed):
        cs[0].allreduce(np.ones(4, np.float32))
    again = JobConfig(1, job.members, elements=256, session=0x435)
    server.model.add_job(again)
    for c in cs:
        c.session = again.session
    for r, secs in _ranks(cs):
        assert not isinstance(r, Exception), r
        assert np.all(r == 3) and secs < 5


# -- a static job can be run again ------------------------------------------------------
def test_static_job_runs_twice_and_never_sees_stored_results(switch_of):
    """A static job (in the switch's table beforehand, as on an FPGA) run twice by
    `ina allreduce --switch` (LocalCluster): the second run resumes at the switch's
    position (STATUS) instead of starting at seq 0, where its DATA was stale (or took
    the first run's stored results: "refetched 16"). A run after one that left slots
    open (failed mid-call) is refused at once, naming it."""
    from conftest import consecutive_free_ports
    from ina_fabric.host.cluster import LocalCluster, WorkerSpec
    from ina_fabric.protocol.jobtable import job_defaults
    base = consecutive_free_ports(2)
    settings = job_defaults("ethernet")
    job = JobConfig(5, (f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"), settings.window,
                    settings.elements, session=0x436)
    server = switch_of([job])
    switch = f"127.0.0.1:{server.address[1]}"
    spec = WorkerSpec(job=5, nworkers=2, settings=settings, base_port=base, session=0x436)
    for run in range(2):
        with LocalCluster(spec, switch=switch) as cluster:
            res = cluster.allreduce_check(10_000, 2)
        assert res["within_bound"], run
        assert all(r["stats"]["refetched"] == 0 for r in res["per_worker"]), run
    position = server.model.status()["jobs"][5]["position"]
    assert position > 0
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)      # worker 0 starts a call
    s.bind(("127.0.0.1", base))
    s.sendto(pack(np.ones(0), job=5, worker=0, seq=position, session=0x436), server.address)
    s.close()
    time.sleep(0.1)
    t0 = time.monotonic()
    with pytest.raises(SwitchRefused, match="open slot"):
        with LocalCluster(spec, switch=switch) as cluster:
            cluster.allreduce_check(10_000, 1)
    assert time.monotonic() - t0 < 5


# -- ina train against a static job ---------------------------------------------------
def test_train_static_job_twice_and_with_too_many_workers(switch_of):
    """`ina train --static-job` (run_training) twice against one static job: the second
    run resumes (before: its DATA was stale, it fell back to Gloo without a word and
    exited 0; or it took the first run's stored results). With 4 workers against the
    2-member job: every rank raises, naming both counts (before: 200 s with ranks 2-3 on
    Gloo and ranks 0-1 on the switch)."""
    from conftest import consecutive_free_ports
    from ina_fabric.host.ddp.train import TrainConfig, run_training
    base = consecutive_free_ports(4)
    job = JobConfig(1, (f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"), elements=256,
                    session=0x437)
    server = switch_of([job])
    cfg = dict(backend="ina", switch=f"127.0.0.1:{server.address[1]}", static_job=True,
               worker_base_port=base, session=0x437, elements=256, max_steps=3,
               stop_at_target=False)
    for run in range(2):
        res = run_training(TrainConfig(workers=2, **cfg))
        assert res.fallbacks == 0 and res.stats["packets_sent"] > 0, run
        assert res.stats["refetched"] == 0 and len(set(res.param_hashes)) == 1, run
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"holds job 1 with 2 member\(s\), and this run "
                                           r"has 4 workers"):
        run_training(TrainConfig(workers=4, **cfg))
    assert time.monotonic() - t0 < 90      # process start-up and torch imports included
