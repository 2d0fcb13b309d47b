"""Directed scenarios for the answer to refused DATA (issue 43, ``hw/ina/answer.py``):
one per reason the model answers (``fields.Refusal``), the per-source rate limit, and
a flood. Each returns (jobs, traffic, gaps, expected model counters, expected ERRORs
[(reason, figure)] in order); the bench runs them on a core built with
``REFUSAL_INTERVAL`` cycles between two answers to one source bucket (the scoreboard's
model with the same), and the scoreboard checks every ERROR byte for byte.
"""

from ina_fabric.protocol.fields import Refusal, HEADER_BYTES, field_offsets
from ina_fabric.protocol.numpy_view import pack

from .directed import _job, _d, E

__all__ = ["SCENARIOS", "REFUSAL_INTERVAL", "flood"]

#: cycles between two ERRORs to one source bucket in these benches (short, so a
#: scenario can wait it out)
REFUSAL_INTERVAL = 400
_OFF = field_offsets()


def _set(d, field, value, width):
    b = bytearray(d)
    b[_OFF[field]:_OFF[field] + width] = value.to_bytes(width, "big")
    return bytes(b)


def unknown_job():
    a = _job(n=2)
    d, src = _d(a, 0, 0)
    t = [(_set(d, "job", 1234, 2), src)]
    return [a], t, [0], {"drop_unknown_job": 1, "errors_sent": 1}, \
        [(Refusal.UNKNOWN_JOB, 0)]


def not_member():
    """A member's DATA from another address, and a worker number beyond the job's."""
    a = _job(n=3)
    d, src = _d(a, 0, 0)
    d1, src1 = _d(a, 1, 0)
    t = [(d, ("10.9.9.9", src[1])), (_set(d1, "worker", 5, 1), src1)]
    return [a], t, [0, 0], {"drop_unknown_source": 2, "errors_sent": 2}, \
        [(Refusal.NOT_MEMBER, 3), (Refusal.NOT_MEMBER, 3)]


def bad_length():
    """More elements than the job's; then (after the interval) fewer than the open
    slot's; then at once again (limited)."""
    a = _job(n=2)
    t = [_d(a, 0, 0, [1] * (E + 1)),        # 5 > 4 elements
         _d(a, 1, 0, [1, 2]),               # opens seq 0 with 2 elements
         _d(a, 0, 0),                       # 4 elements: not the slot's 2
         _d(a, 0, 0, [5])]                  # 1: not the slot's 2, same source: limited
    gaps = [0, 0, REFUSAL_INTERVAL + 10, 0]
    return [a], t, gaps, {"drop_malformed": 3, "errors_sent": 2, "errors_limited": 1}, \
        [(Refusal.BAD_LENGTH, E), (Refusal.BAD_LENGTH, 2)]


def bad_session():
    a = _job(n=2)
    d, src = _d(a, 1, 0)
    t = [(_set(d, "session", a.session ^ 0x100, 8), src)]
    return [a], t, [0], {"drop_bad_session": 1, "errors_sent": 1}, \
        [(Refusal.BAD_SESSION, 0)]


def stale():
    """A job at position 6 (seqs 0..5 complete, window 2): a seq it has passed gets the
    position; so does the other worker's, in its own bucket."""
    a = _job(n=2, window=2)
    t = []
    for seq in range(6):
        t += [_d(a, 0, seq), _d(a, 1, seq)]
    t += [_d(a, 0, 1), _d(a, 1, 0)]
    return [a], t, [0] * len(t), {"drop_stale": 2, "errors_sent": 2, "results": 6}, \
        [(Refusal.STALE, 6), (Refusal.STALE, 6)]


def rate_limit():
    """Five refusals from one source in a row: one answer; after the interval, one more.
    Another source's refusal in between is answered (its own bucket)."""
    a = _job(n=2)
    d, src = _d(a, 0, 0)
    bad = _set(d, "job", 77, 2)
    t = [(bad, src)] * 5 + [_d(a, 1, 0, [1] * (E + 2)), (bad, src)]
    gaps = [0] * 5 + [0, REFUSAL_INTERVAL + 10]
    return [a], t, gaps, {"drop_unknown_job": 6, "drop_malformed": 1, "errors_sent": 3,
                          "errors_limited": 4}, \
        [(Refusal.UNKNOWN_JOB, 0), (Refusal.BAD_LENGTH, E), (Refusal.UNKNOWN_JOB, 0)]


SCENARIOS = {f.__name__: f for f in (unknown_job, not_member, bad_length, bad_session,
                                      stale, rate_limit)}


def flood(n=240):
    """Wrong DATA back to back from the six members of a job: mostly more elements
    than the job's (BAD_LENGTH), also header-only DATA of an unknown job (one beat each
    at 8 lanes: a refusal every cycle) and another member's DATA (NOT_MEMBER): at most
    one ERROR per source per interval, none larger than its DATA."""
    a = _job(n=6)
    t = []
    for i in range(n):
        w = i % a.n
        kind = (i // a.n) % 4
        if kind == 1:
            d = pack([], job=4000 + i, session=a.session, worker=w, seq=i)
        elif kind == 3:
            d = pack([i] * E, job=a.job, session=a.session, worker=(w + 1) % a.n, seq=0)
        else:
            d = pack([i] * (E + 1 + kind), job=a.job, session=a.session, worker=w, seq=i)
        src = a.members[w].addr
        assert len(d) >= HEADER_BYTES
        t.append((d, src))
    return [a], t, [0] * len(t)
