"""Each job's own counters (``JOB_COUNTERS``): what the reference model counts for a
job's datagrams once the job is found, and for its slots' results, beside the switch's
totals; carried in STATUS per job (the C engine keeps the same, tested differentially in
test_switch_engine.py and test_engine_tree.py)."""

import json

import numpy as np

from ina_fabric.host.switch import SwitchModel
from ina_fabric.protocol import pack, MsgType, HEADER_BYTES
from ina_fabric.protocol.auth import seal, unseal, STATUS_MIN_REQUEST, TRAILER_BYTES
from ina_fabric.protocol.counters import JOB_COUNTERS
from ina_fabric.protocol.jobtable import JobConfig

KEY = bytes(range(32))
A = [("127.0.0.1", 5000 + i) for i in range(4)]


def _model(mode="reliable"):
    m = SwitchModel(key=KEY)
    m.add_job(JobConfig(1, (f"{A[0][0]}:{A[0][1]}", f"{A[1][0]}:{A[1][1]}"), elements=4,
                        session=11, mode=mode, deadline=0.01))
    m.add_job(JobConfig(2, (f"{A[2][0]}:{A[2][1]}", f"{A[3][0]}:{A[3][1]}"), elements=4,
                        session=22))
    return m


def _data(job, worker, seq, session):
    return pack(np.arange(4), job=job, worker=worker, seq=seq, session=session)


def test_each_job_counts_its_own_and_the_switch_their_sum():
    m = _model()
    m.process(_data(1, 0, 0, 11), A[0], 0.0)
    m.process(_data(1, 1, 0, 11), A[1], 0.0)          # job 1: a result
    m.process(_data(1, 1, 0, 11), A[1], 0.0)          # a re-send: duplicate, resent
    m.process(_data(2, 0, 0, 99), A[2], 0.0)          # job 2: another run's session
    m.process(_data(2, 0, 0, 22), A[0], 0.0)          # job 2 from job 1's worker
    m.process(_data(3, 0, 0, 22), A[0], 0.0)          # no such job: the switch's only
    m.process(b"short", A[0], 0.0)                    # no job known: the switch's only
    assert m.job_counters(1) == {"accepted": 2, "duplicates": 1, "resent": 1, "results": 1,
                                 "rx_data": 3}
    assert m.job_counters(2) == {"drop_bad_session": 1, "drop_unknown_source": 1}
    for name in JOB_COUNTERS:
        assert m.counters[name] == m.job_counters(1).get(name, 0) + \
            m.job_counters(2).get(name, 0), name
    assert m.counters["drop_unknown_job"] == 1 and m.counters["drop_truncated"] == 1
    assert m.status()["jobs"][1]["counters"] == m.job_counters(1)


def test_partials_at_the_deadline_are_the_jobs_and_a_new_install_starts_at_zero():
    m = _model(mode="bounded")
    m.process(_data(1, 0, 0, 11), A[0], 0.0)
    m.tick(1.0)                                       # the deadline: a PARTIAL result
    assert m.job_counters(1) == {"accepted": 1, "partials": 1, "results": 1, "rx_data": 1}
    m.add_job(JobConfig(1, (f"{A[0][0]}:{A[0][1]}",), elements=4, session=12))
    assert m.job_counters(1) == {} and m.counters["results"] == 1


def test_a_status_page_always_moves_on():
    """A job entry too large for a page beside the switch's counters is sent alone on its
    page without its counters (``None``), so a client's paging never stalls."""
    m = _model()
    for k, v in list(m.counters.items()):
        m._counts[k] = 10 ** 9
    for name in JOB_COUNTERS:
        m.jobs[1].counts[name] = 10 ** 12
    req = pack(None, type=MsgType.STATUS_REQ) + \
        bytes(STATUS_MIN_REQUEST - HEADER_BYTES - 4 - TRAILER_BYTES) + (0).to_bytes(4, "big")
    (_, reply), = m.process(seal(req, KEY, 1), ("127.0.0.1", 1), 0.0)
    assert len(reply) <= len(req)
    doc = json.loads(unseal(reply, KEY)[0][HEADER_BYTES:])
    assert doc["jobs"]["1"]["counters"] is None and doc["next_job"] == 2
