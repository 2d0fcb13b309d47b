"""The reference switch model: one directed test per row of DESIGN.md's semantics table,
and property tests of its invariants."""

import copy

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ina_fabric.host.switch import SwitchModel, INT32_MAX, INT32_MIN, GROUP_WORKER
from ina_fabric.protocol import pack, unpack, MsgType, Flags, HEADER_BYTES
from ina_fabric.protocol.fields import VERSION, Refusal
from ina_fabric.protocol.jobtable import JobConfig, MAX_ELEMENTS
from ina_fabric.protocol.auth import seal, unseal, TRAILER_BYTES

N, W, E = 4, 4, 8
KEY = bytes(range(32))
ADDR = [("127.0.0.1", 5000 + w) for w in range(N)]


SESSION = 0x5E55_1017   # the session of every job here (unless a test says otherwise)


def job(mode="reliable", deadline=0.010, n=N, mcast=None, session=SESSION):
    return JobConfig(1, tuple(f"{a}:{p}" for a, p in ADDR[:n]), window=W, elements=E,
                     deadline=deadline, mode=mode, mcast=mcast, session=session)


def data(worker, seq, values=None, exponent=0, job_id=1, session=SESSION, **kw):
    if values is None:
        values = np.full(E, worker + 1)
    return pack(values, job=job_id, worker=worker, seq=seq, exponent=exponent,
                session=session, **kw)


def send(m, worker, seq, now=0.0, **kw):
    return m.process(data(worker, seq, **kw), ADDR[worker], now)


def errors(out, reason=None):
    """True when ``out`` holds nothing but ERROR answers (header only, issue 43), each
    with ``reason`` when given: a refused DATA reaches no sum and no RESULT."""
    return all(len(d) == HEADER_BYTES and unpack(d)[0]["type"] == MsgType.ERROR and
               (reason is None or unpack(d)[0]["count"] == reason) for _, d in out)


def state(m):
    """Everything that is aggregation state (not counters)."""
    out = []
    for js in m.jobs.values():
        for s in (0, 1):
            for slot in js.slots[s]:
                out.append((slot.tag, slot.complete, slot.bitmap, slot.count, slot.exponent,
                            None if slot.acc is None else slot.acc.tobytes(), slot.result))
    return out


def test_first_packet_opens_slot():
    m = SwitchModel([job()])
    assert send(m, 0, 0, now=1.5) == []
    slot = m.jobs[1].slots[0][0]
    assert (slot.tag, slot.complete, slot.bitmap, slot.count, slot.opened_at) == (0, False, 1, 1, 1.5)


def test_complete_slot_multicasts_result_to_group():
    m = SwitchModel([job()])
    for w in range(N - 1):
        assert send(m, w, 0, exponent=w) == []
    out = send(m, N - 1, 0, exponent=-3)
    assert [d for d, _ in out] == ADDR
    h, elems = unpack(out[0][1])
    assert h["type"] == MsgType.RESULT and h["count"] == N and h["bitmap"] == 0xF
    assert h["exponent"] == 2 and h["worker"] == GROUP_WORKER and h["flags"] == 0
    assert list(elems) == [1 + 2 + 3 + 4] * E


def test_ip_multicast_mode_sends_one_copy():
    m = SwitchModel([job(mcast=("239.1.2.3", 6000))])
    for w in range(N):
        out = send(m, w, 0)
    assert [d for d, _ in out] == [("239.1.2.3", 6000)]


def test_duplicate_not_added_and_resent_when_complete():
    m = SwitchModel([job()])
    send(m, 0, 0)
    assert send(m, 0, 0) == []
    assert m.counters["duplicates"] == 1
    for w in range(1, N):
        out = send(m, w, 0)
    assert list(unpack(out[0][1])[1]) == [10] * E
    again = send(m, 2, 0, flags=Flags.RETRANSMIT)
    assert len(again) == 1 and again[0][0] == ADDR[2]
    h, elems = unpack(again[0][1])
    assert h["worker"] == 2 and h["flags"] & Flags.RETRANSMIT and list(elems) == [10] * E


def test_saturation_sets_overflow_and_is_order_independent():
    big = np.full(E, INT32_MAX)
    neg = np.full(E, -5)
    results = []
    for order in ([0, 1, 2, 3], [3, 2, 1, 0]):
        m = SwitchModel([job()])
        for w in order:
            out = send(m, w, 0, values=big if w < 2 else neg)
        h, elems = unpack(out[0][1])
        results.append(out[0][1])
        assert h["flags"] & Flags.OVERFLOW and m.counters["overflows"] == 1
        assert list(elems) == [INT32_MAX] * E
    assert results[0] == results[1]
    m = SwitchModel([job()])
    for w in range(N):
        out = send(m, w, 0, values=np.full(E, INT32_MIN))
    assert list(unpack(out[0][1])[1]) == [INT32_MIN] * E


def test_deadline_partial_then_late_worker_gets_same_result():
    m = SwitchModel([job("bounded", deadline=0.010)])
    send(m, 0, 0, now=0.0)
    send(m, 2, 0, now=0.001)
    assert m.tick(0.009) == []
    out = m.tick(0.010)
    assert [d for d, _ in out] == ADDR
    h, elems = unpack(out[0][1])
    assert h["flags"] & Flags.PARTIAL and h["count"] == 2 and h["bitmap"] == 0b0101
    assert list(elems) == [1 + 3] * E
    late = send(m, 1, 0, now=0.02)
    assert len(late) == 1 and late[0][0] == ADDR[1]
    assert unpack(late[0][1])[1].tolist() == elems.tolist()
    assert m.counters["late"] == 1 and m.counters["partials"] == 1


def test_process_fires_due_deadlines_before_the_packet():
    m = SwitchModel([job("bounded", deadline=0.010)])
    send(m, 0, 0, now=0.0)
    out = send(m, 1, 0, now=0.5)
    assert out[0][0] == ADDR[0] and unpack(out[0][1])[0]["count"] == 1  # partial first
    assert out[-1][0] == ADDR[1]  # then the late worker's unicast copy


def test_reliable_mode_has_no_deadline():
    m = SwitchModel([job("reliable")])
    send(m, 0, 0, now=0.0)
    assert m.tick(100.0) == [] and m.next_deadline() is None


def test_slot_reuse_two_windows_later_and_stale():
    m = SwitchModel([job()])
    for w in range(N):
        send(m, w, 1)
    for w in range(N):
        out = send(m, w, 1 + 2 * W)  # same set and index, next use
    assert unpack(out[0][1])[0]["seq"] == 1 + 2 * W
    before = state(m)
    (dest, err), = send(m, 0, 1)            # answered (issue 43): STALE, the position
    h = unpack(err)[0]
    assert dest == ADDR[0] and len(err) == 28 and h["type"] == MsgType.ERROR
    assert h["count"] == Refusal.STALE and h["bitmap"] == 2 + 2 * W and h["seq"] == 1
    assert m.counters["drop_stale"] == 1 and state(m) == before


def test_out_of_window():
    m = SwitchModel([job()])
    send(m, 0, 0)
    before = state(m)
    assert send(m, 1, 2 * W) == []          # slot 0/set 0 still open
    assert send(m, 1, 5 * W) == []          # far ahead
    assert m.counters["drop_out_of_window"] == 2 and state(m) == before


BAD = {
    "drop_truncated": [b"", b"\x01" * 7, data(0, 0)[:HEADER_BYTES + 5]],
    "drop_bad_version": [bytes([VERSION ^ 3]) + data(0, 0)[1:]],
    "drop_unknown_job": [data(0, 0, job_id=99)],
    "drop_malformed": [data(0, 0) + b"\x00\x00\x00\x00",                     # longer than nelem
                       pack(np.zeros(E + 1), job=1, worker=0, seq=0, session=SESSION),        # too many elements
                       pack(np.zeros(E), job=1, worker=0, seq=0, type=MsgType.RESULT,
                            session=SESSION)],
}


@pytest.mark.parametrize("reason", sorted(BAD))
def test_bad_datagrams_counted_and_state_untouched(reason):
    m = SwitchModel([job()])
    send(m, 1, 0)
    before = state(m)
    for dgram in BAD[reason]:
        assert errors(m.process(dgram, ADDR[0], 0.0))
    assert m.counters[reason] == len(BAD[reason]) and state(m) == before


def test_unknown_source_and_worker_out_of_range():
    m = SwitchModel([job()])
    before = state(m)
    out = m.process(data(0, 0), ("127.0.0.1", 9999), 0.0)          # not a member address
    assert errors(out, Refusal.NOT_MEMBER) and out[0][0] == ("127.0.0.1", 9999)
    assert unpack(out[0][1])[0]["bitmap"] == N                      # the job's members
    assert errors(m.process(data(1, 0), ADDR[0], 0.0), Refusal.NOT_MEMBER)  # mismatch
    assert errors(m.process(data(7, 0), ADDR[0], 0.0), Refusal.NOT_MEMBER)  # worker >= N
    assert m.counters["drop_unknown_source"] == 3 and state(m) == before


def test_mismatched_element_count_in_open_slot_is_dropped():
    m = SwitchModel([job()])
    send(m, 0, 0)
    before = state(m)
    out = m.process(pack(np.ones(E - 1), job=1, worker=1, seq=0, session=SESSION), ADDR[1], 0.0)
    assert errors(out, Refusal.BAD_LENGTH) and unpack(out[0][1])[0]["bitmap"] == E
    assert m.counters["drop_malformed"] == 1 and state(m) == before


def test_control_installs_job_and_status_reports():
    m = SwitchModel(key=KEY)
    cfg = job()
    hdr = pack(type=MsgType.CONTROL)
    reply = m.process(seal(hdr + cfg.to_bytes(), KEY, 1), ("127.0.0.1", 1), 0.0)
    assert reply and 1 in m.jobs and m.jobs[1].cfg == cfg
    assert m.process(seal(hdr + b"\x00" * 3, KEY, 2), ("127.0.0.1", 1), 0.0) == []
    assert m.counters["drop_malformed"] == 1


# ---- properties ---------------------------------------------------------------------

contrib = st.lists(st.integers(INT32_MIN, INT32_MAX), min_size=E, max_size=E)


@given(st.lists(contrib, min_size=N, max_size=N), st.permutations(range(N)),
       st.lists(st.integers(0, N - 1), max_size=6))
@settings(max_examples=150, deadline=None)
def test_order_independent_and_duplicates_never_added(values, order, dups):
    outs = []
    for perm in (list(range(N)), list(order)):
        m = SwitchModel([job()])
        result = []
        for i, w in enumerate(perm):
            result += send(m, w, 3, values=np.array(values[w]))
            for d in dups:  # duplicates interleaved, from workers already in
                if d in perm[:i + 1]:
                    result += send(m, d, 3, values=np.array(values[d]))
        outs.append([r for r in result if unpack(r[1])[0]["worker"] == GROUP_WORKER])
    assert outs[0] == outs[1] and len(outs[0]) == N
    exact = np.sum(np.array(values, dtype=np.int64), axis=0)
    assert unpack(outs[0][0][1])[1].tolist() == np.clip(exact, INT32_MIN, INT32_MAX).tolist()


@given(st.binary(max_size=80))
@settings(max_examples=300, deadline=None)
def test_garbage_never_changes_state(blob):
    m = SwitchModel([job()])
    send(m, 0, 0)
    before = state(m)
    m.process(blob, ADDR[3], 0.0)
    if state(m) != before:  # only a well-formed DATA from worker 3 may change state
        h, _ = unpack(blob)
        assert h["type"] == MsgType.DATA and h["worker"] == 3 and h["job"] == 1


@given(st.sets(st.integers(0, N - 1), min_size=1, max_size=N - 1))
@settings(max_examples=50, deadline=None)
def test_partial_carries_exact_contributor_set(present):
    m = SwitchModel([job("bounded", deadline=0.01)])
    for w in sorted(present):
        send(m, w, 0)
    h, elems = unpack(m.tick(1.0)[0][1])
    assert h["bitmap"] == sum(1 << w for w in present) and h["count"] == len(present)
    assert elems.tolist() == [sum(w + 1 for w in present)] * E


def test_live_update_keeps_slots_and_changes_only_the_deadline():
    from ina_fabric.protocol.jobtable import ConfigError
    m = SwitchModel([job("bounded", deadline=0.010)])
    send(m, 0, 0)
    m.update_job(job("bounded", deadline=0.050))        # live deadline change
    assert m.tick(0.02) == [] and m.jobs[1].slots[0][0].bitmap == 1
    assert len(m.tick(0.05)) == N                       # the new deadline applies
    with pytest.raises(ConfigError, match="only the deadline"):
        m.update_job(job("reliable", deadline=0.050))   # a mode change is no live update
    with pytest.raises(ConfigError, match="not installed"):
        SwitchModel().update_job(job())


def test_reinstall_starts_afresh():
    """A job installed again with the same geometry starts with fresh slots. Before, the
    slots were kept: a second run starting at seq 0 got the first run's stored result
    as a RETRANSMIT (silently wrong data) or drop_stale."""
    m = SwitchModel([job()])
    for w in range(N):
        send(m, w, 0, values=np.full(E, 1))
    m.add_job(job())                                    # run 2: same job, same geometry
    out = []
    for w in range(N):
        out += send(m, w, 0, values=np.full(E, 100))
    assert len(out) == N
    h, elems = unpack(out[0][1])
    assert not h["flags"] & Flags.RETRANSMIT and list(elems) == [400] * E


def test_data_of_another_session_is_dropped_and_results_carry_the_session():
    """A DATA packet whose session is not its job's (a previous run's, another tenant's,
    a forger's) never reaches a sum. Before, DATA was trusted on its source address
    alone: spoofed datagrams with a member's id made every replica receive their sum."""
    m = SwitchModel([job()])
    assert errors(send(m, 0, 0, values=np.full(E, 4096), session=SESSION ^ 1),
                  Refusal.BAD_SESSION)
    assert m.counters["drop_bad_session"] == 1 and m.jobs[1].slots[0][0].bitmap == 0
    out = []
    for w in range(N):
        out += send(m, w, 0, values=np.full(E, 1))
    h, elems = unpack(out[0][1])
    assert h["session"] == SESSION and list(elems) == [N] * E


def test_a_taken_job_id_is_refused_not_replaced():
    """An install under another session is refused while the job is active (a second
    tenant's rank 0 used to replace a running job); the same session re-installs; an
    idle job may be taken over; updates and removals must carry the job's session."""
    from ina_fabric.protocol.jobtable import ConfigError
    from ina_fabric.host.switch.model import IDLE_RECLAIM_S
    m = SwitchModel()
    m.add_job(job(), now=0.0)
    send(m, 0, 0, now=10.0)
    with pytest.raises(ConfigError, match="taken by another run"):
        m.add_job(job(session=SESSION + 1), now=11.0)
    assert m.jobs[1].cfg.session == SESSION and m.jobs[1].slots[0][0].bitmap == 1
    with pytest.raises(ConfigError, match="another session"):
        m.update_job(job(deadline=0.5, session=SESSION + 1))
    with pytest.raises(ConfigError, match="another session"):
        m.remove_job(1, SESSION + 1)
    m.add_job(job(), now=12.0)                          # its own run again: afresh
    assert m.jobs[1].slots[0][0].bitmap == 0
    m.add_job(job(session=SESSION + 1), now=12.0 + IDLE_RECLAIM_S)   # idle: taken over
    assert m.jobs[1].cfg.session == SESSION + 1
    m.remove_job(1, SESSION + 1)
    assert 1 not in m.jobs


def test_control_datagrams_install_update_remove_and_refuse():
    from ina_fabric.host.switch.model import MAX_JOB_BYTES
    import itertools
    import json
    m = SwitchModel(key=KEY)
    nonces = itertools.count(1)

    def control(cfg, update=False):
        hdr = pack(None, type=MsgType.CONTROL)
        nonce = next(nonces)
        (dest, reply), = m.process(seal(hdr + cfg.to_bytes(update=update), KEY, nonce),
                                   ("127.0.0.1", 1), 0.0)
        body, echoed = unseal(reply, KEY)
        assert echoed == nonce
        return json.loads(body[HEADER_BYTES:])

    assert control(job("bounded"))["ok"]
    send(m, 0, 0)
    assert control(job("bounded", deadline=0.5), update=True)["op"] == "update"
    assert m.jobs[1].slots[0][0].bitmap == 1            # kept
    assert "only the deadline" in control(job("reliable"), update=True)["error"]
    big = JobConfig(2, ("127.0.0.1:9",), window=32768, elements=MAX_ELEMENTS)
    assert "per-job limit" in control(big)["error"]
    assert 2 not in m.jobs and m.counters["control_refused"] == 2
    assert control(job())["op"] == "install"
    assert m.jobs[1].slots[0][0].bitmap == 0            # fresh
    assert MAX_JOB_BYTES < 2 * 32768 * MAX_ELEMENTS * 12


def test_admission_limits():
    from ina_fabric.protocol.jobtable import ConfigError
    m = SwitchModel(max_jobs=2, max_total_bytes=3 * 2 * W * E * 12)
    for j in (1, 2):
        m.add_job(JobConfig(j, ("127.0.0.1:1",), window=W, elements=E))
    with pytest.raises(ConfigError, match="2 jobs, its limit"):
        m.add_job(JobConfig(3, ("127.0.0.1:1",), window=W, elements=E))
    m.add_job(JobConfig(2, ("127.0.0.1:1",), window=W, elements=E))   # replacing is fine
    with pytest.raises(ConfigError, match="are free"):
        m.add_job(JobConfig(2, ("127.0.0.1:1",), window=4 * W, elements=E))


def test_status_is_paged_and_never_larger_than_its_request():
    """STATUS fit one datagram only up to about 600 jobs, and a 20-byte request got up to
    65 KB back (a reflection amplifier). Now a request must be padded, a reply never
    exceeds it, and pages cover every job."""
    import json
    from ina_fabric.host.switch.model import STATUS_MIN_REQUEST
    from ina_fabric.protocol.auth import TRAILER_BYTES
    m = SwitchModel(key=KEY)
    for j in range(1000):
        m.add_job(JobConfig(j, ("127.0.0.1:1",), window=2, elements=2))
    assert m.process(seal(pack(None, type=MsgType.STATUS_REQ), KEY, 1), ("127.0.0.1", 1),
                     0.0) == []
    seen, start, pages = set(), 0, 0
    while start is not None:
        req = pack(None, type=MsgType.STATUS_REQ) + \
            bytes(STATUS_MIN_REQUEST - HEADER_BYTES - 4 - TRAILER_BYTES) + start.to_bytes(4, "big")
        req = seal(req, KEY, 100 + pages)
        (dest, reply), = m.process(req, ("127.0.0.1", 1), 0.0)
        assert len(reply) <= len(req)
        doc = json.loads(unseal(reply, KEY)[0][HEADER_BYTES:])
        seen |= {int(j) for j in doc["jobs"]}
        start, pages = doc["next_job"], pages + 1
    assert seen == set(range(1000)) and pages > 1


def test_status_request_sizes_the_gateware_can_buffer():
    """A STATUS_REQ is answered only at 1,200 to 2,048 bytes in whole words (the rule
    the gateware follows: it buffers the request while it checks the tag); any other
    size is status_unpadded, unanswered, sealed or not."""
    from ina_fabric.protocol.auth import STATUS_MIN_REQUEST, STATUS_MAX_REQUEST
    m = SwitchModel(key=KEY)
    src = ("127.0.0.1", 1)
    hdr = pack(None, type=MsgType.STATUS_REQ)
    for k, n in enumerate((STATUS_MIN_REQUEST + 1, STATUS_MAX_REQUEST + 4)):
        assert m.process(seal(hdr + bytes(n - HEADER_BYTES - TRAILER_BYTES), KEY, 10 + k), src, 0.0) == []
    assert m.counters["status_unpadded"] == 2
    for k, n in enumerate((STATUS_MIN_REQUEST, STATUS_MAX_REQUEST)):
        assert len(m.process(seal(hdr + bytes(n - HEADER_BYTES - TRAILER_BYTES), KEY, 20 + k), src, 0.0)) == 1
    assert m.counters["status_unpadded"] == 2 and m.counters["status_requests"] == 4


def test_per_packet_cost_does_not_walk_every_job():
    """Bounded deadlines sit in one heap: with 2000 idle jobs installed, tick touches
    none of them (it walked every job on every packet before)."""
    m = SwitchModel([job("bounded")])
    for j in range(2, 2002):
        m.add_job(JobConfig(j, ("127.0.0.1:1",), window=2, elements=2, mode="bounded"))
    calls = []
    orig = m._live
    m._live = lambda e: calls.append(e) or orig(e)
    send(m, 0, 0, now=0.0)
    m.tick(0.001)
    assert len(calls) <= 2


def test_control_needs_the_key_and_a_fresh_nonce():
    """Any host that reached the port could install, replace or delete any job with one
    CONTROL and read every job with STATUS_REQ. Now: a datagram not sealed with the
    switch's key, sealed with another key, or replayed is a counted drop, unanswered."""
    from ina_fabric.host.switch.model import STATUS_MIN_REQUEST
    m = SwitchModel(key=KEY)
    ctl = pack(None, type=MsgType.CONTROL) + job().to_bytes()
    src = ("127.0.0.1", 1)
    assert m.process(ctl, src, 0.0) == []                              # not sealed
    assert m.process(seal(ctl, b"x" * 32, 5), src, 0.0) == []          # another key
    sealed = seal(ctl, KEY, 5)
    tampered = bytearray(sealed)
    tampered[HEADER_BYTES] ^= 1
    assert m.process(bytes(tampered), src, 0.0) == []                  # altered
    assert len(m.process(sealed, src, 0.0)) == 1 and 1 in m.jobs       # the real one
    m.remove_job(1)
    assert m.process(sealed, src, 0.0) == [] and 1 not in m.jobs       # replayed
    status = pack(None, type=MsgType.STATUS_REQ) + bytes(STATUS_MIN_REQUEST)
    assert m.process(status, src, 0.0) == []                           # not sealed
    assert m.counters["drop_unauthenticated"] == 5
    keyless = SwitchModel()                                            # no key: no control
    assert keyless.process(seal(ctl, KEY, 9), src, 0.0) == []
    assert keyless.counters["drop_malformed"] == 1 and not keyless.jobs


def test_replay_guard_keeps_the_highest_nonces():
    """The rule the gateware follows too: the REPLAY_SLOTS highest nonces are kept; a
    nonce is taken once, and once the store is full only above its lowest."""
    from ina_fabric.protocol.auth import ReplayGuard
    g = ReplayGuard(slots=3)
    assert g.take(1000) and not g.take(1000)
    assert g.take(950) and g.take(900) and not g.take(950)     # full: 900, 950, 1000
    assert not g.take(899) and g.take(901)                     # 900 goes
    assert not g.take(900) and not g.take(901) and g.take(5000)
    assert sorted(g.kept) == [950, 1000, 5000]


def test_control_of_impossible_length_is_malformed_before_the_tag():
    """A CONTROL that cannot hold an entry and the trailer is malformed whether or not
    it is sealed (the gateware checks its length before hashing it)."""
    from ina_fabric.protocol.auth import MAX_CONTROL_BYTES, control_length_ok
    m = SwitchModel(key=KEY)
    ctl = pack(None, type=MsgType.CONTROL) + job().to_bytes()
    src = ("127.0.0.1", 1)
    assert control_length_ok(len(seal(ctl, KEY, 1)))
    assert m.process(seal(ctl + b"\0", KEY, 1), src, 0.0) == []
    assert m.process(ctl[:30], src, 0.0) == []
    assert m.process(seal(ctl + bytes(MAX_CONTROL_BYTES), KEY, 2), src, 0.0) == []
    assert m.counters["drop_malformed"] == 3 and m.counters["drop_unauthenticated"] == 0
    assert len(m.process(seal(ctl, KEY, 3), src, 0.0)) == 1 and 1 in m.jobs


def test_sequence_numbers_wrap_at_2_32():
    """Every comparison is modular: a job that has run 2^32 packets goes on across the
    wrap. Before, the call that crossed it got drop_stale for every packet."""
    SEQ_MASK = 0xFFFFFFFF
    m = SwitchModel([job()])
    start = (1 << 32) - 3 * W // 2            # as after 2^32 - 1.5 W packets
    for t in range(start - 2 * W, start):     # each record holds its latest seq, done
        t &= SEQ_MASK
        m.jobs[1].slots[(t // W) % 2][t % W].tag = t
    results = 0
    for k in range(3 * W):
        seq = (start + k) & SEQ_MASK
        out = []
        for w in range(N):
            out += send(m, w, seq)
        assert len(out) == N, (k, seq, dict(m.counters))
        h, elems = unpack(out[0][1])
        assert h["seq"] == seq and list(elems) == [1 + 2 + 3 + 4] * E
        results += 1
    assert results == 3 * W and m.counters["drop_stale"] == 0
    # behind the window across the wrap is stale, ahead is out of window
    send(m, 0, (start - 1) & SEQ_MASK)
    send(m, 0, (start + 3 * W + 2 * W) & SEQ_MASK)
    assert m.counters["drop_stale"] == 1 and m.counters["drop_out_of_window"] == 1


def test_window_must_be_a_power_of_two():
    from ina_fabric.protocol.jobtable import ConfigError
    with pytest.raises(ConfigError, match="power of two"):
        JobConfig(1, ("127.0.0.1:1",), window=6)


def test_packet_for_a_virtual_seq_before_the_job_began_is_stale():
    """Before any traffic each record holds a virtual, complete seq (2W behind). A worker
    that sends that seq used to make the model re-send a result that does not exist
    (a TypeError inside ``process``); now it is a counted stale drop."""
    m = SwitchModel([job()])
    assert errors(send(m, 0, (1 << 32) - 2 * W), Refusal.STALE)
    assert m.counters["drop_stale"] == 1 and m.counters["resent"] == 0
