"""The client's precision (issue 40, docs/precision.md): narrow widths, deterministic and
stochastic rounding, the Hadamard rotation, through a real switch over loopback, on the
Python loop and the compiled one (the same bits), every result checked against its
width's error bound."""

import numpy as np
import pytest

from ina_fabric.host.transport import fastcall, quantize as Q
from ina_fabric.host.transport.precision import Precision, as_precision
from ina_fabric.host.collectives.hadamard import RandomizedHadamard, DEFAULT_BLOCK

needs_c = pytest.mark.skipif(not fastcall.available(), reason=fastcall.WHY_NOT or "")

PRECISIONS = ["32", "16", "8", "32:stochastic", "16:stochastic", "8:stochastic",
              "16:hadamard", "8:stochastic:hadamard"]


def _inputs(n):
    """Normal values with an outlier per rank (what the rotation is for)."""
    def make(w, k):
        x = np.random.default_rng(100 * w + k).standard_normal(n).astype(np.float32)
        x[(37 * w + k) % n] = 40.0
        return x
    return make


def _run(engine, inputs, precs, workers=3, elements=500, seed=None):
    """One call per precision in ``precs`` on ``workers`` clients against a compiled
    switch; every worker's outputs."""
    from ina_fabric.host.transport import SwitchClient
    from ina_fabric.protocol.jobtable import JobConfig
    from ina_fabric.host.cluster import free_udp_ports
    from test_client_fastpath import _against_switch
    ports = free_udp_ports(workers)
    job = JobConfig(1, tuple(f"127.0.0.1:{p}" for p in ports), window=16,
                    elements=elements)
    outs = [[] for _ in range(workers)]
    errors = []

    def worker(address, w):
        try:
            with SwitchClient(address, 1, w, workers, 16, elements,
                              bind=("127.0.0.1", ports[w]), engine=engine,
                              session=job.session, seed=seed) as c:
                for k, p in enumerate(precs):
                    outs[w].append((c.allreduce(inputs(w, k), precision=p)[0], c.seq))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    _address, counters = _against_switch(job, worker, range(workers), key=None)
    assert not errors, errors
    return outs, counters


def _check_bounds(outs, inputs, precs, workers, elements, seed):
    """Every rank's result of every call within the width's bound (plus float32)."""
    base = 0
    for k, text in enumerate(precs):
        p = as_precision(text)
        xs = [inputs(w, k) for w in range(workers)]
        exact = np.sum(np.array(xs, np.float64), axis=0)
        rot = RandomizedHadamard(seed, block=DEFAULT_BLOCK) if p.rotate else None
        bound = Q.error_bounds(xs, elements, p.bits, p.stochastic, rotate=rot, step=base)
        slack = 1e-6 * (np.abs(np.array(xs, np.float64)).sum(axis=0) + 1) * (
            30 if rot else 1)
        for w in range(workers):
            err = np.abs(outs[w][k][0].astype(np.float64) - exact)
            assert (err <= bound + slack).all(), (text, w, float((err / bound).max()))
            assert np.array_equal(outs[w][k][0], outs[0][k][0])   # replicas identical
        base = outs[0][k][1]
        yield text, float((err / np.maximum(bound, 1e-30)).max())


@needs_c
def test_every_precision_is_within_its_bound_and_the_c_loop_gives_the_python_bits():
    inputs, n, workers, E = _inputs(2_345), 2_345, 3, 500
    c, counters = _run("c", inputs, PRECISIONS, workers, E, seed=9)
    py, _ = _run("python", inputs, PRECISIONS, workers, E, seed=9)
    for w in range(workers):
        for k, text in enumerate(PRECISIONS):
            assert np.array_equal(c[w][k][0], py[w][k][0]), (text, w)
    ratios = dict(_check_bounds(c, inputs, PRECISIONS, workers, E, 9))
    assert counters["overflows"] == 0 and counters["drop_bad_width"] == 0
    # narrow widths really are narrower (and lose precision as the bound says)
    assert ratios["8"] > 0.01


def test_stochastic_rounding_is_unbiased_and_seeded():
    """floor(x + u): the mean over many keys is x; the same key draws the same."""
    x = np.full(20_000, 0.3, np.float32)
    outs = []
    for key in (1, 1, 2):
        buf = np.zeros(20_000 + 64, np.uint8)
        Q.pack_width(x, 0, x.size, 0, 4, buf, 0, 8, True, key)
        outs.append(buf[:x.size].view(np.int8).astype(np.float64) / 16)
    assert np.array_equal(outs[0], outs[1]) and not np.array_equal(outs[0], outs[2])
    assert set(np.unique(outs[0] * 16)) == {4.0, 5.0}         # floor or ceil of 4.8
    assert abs(outs[0].mean() - 0.3) < 0.005 and abs(outs[2].mean() - 0.3) < 0.005
    det = np.zeros(20_064, np.uint8)
    Q.pack_width(x, 0, x.size, 0, 4, det, 0, 8, False, 0)
    assert (det[:x.size].view(np.int8) == 5).all()             # rint(4.8): biased


@needs_c
@pytest.mark.parametrize("bits", [32, 16, 8])
@pytest.mark.parametrize("stochastic", [False, True])
def test_c_width_kernels_are_bit_identical_to_quantize(bits, stochastic):
    from ina_fabric.host.transport import _client
    rng = np.random.default_rng(bits + stochastic)
    for trial in range(20):
        count = int(rng.integers(0, 300))
        x = (rng.standard_normal(count + 3) * 2.0 ** rng.integers(-20, 20)).astype(np.float32)
        if trial == 3 and count:
            x[1] = 1e30                                      # clipped: counted alike
        e = int(Q.local_exponents(x[:max(count, 1)], max(count, 1))[0]) if count else 0
        e = e if e != Q.NO_EXPONENT else 0
        sb = Q.scale_bits(int(rng.integers(1, 9)), bits)
        key = Q.chunk_key(int(rng.integers(0, 2**63)), int(rng.integers(0, 2**32)),
                          int(rng.integers(0, 32)))
        o1, o2 = np.zeros(4 * count + 40, np.uint8), np.zeros(4 * count + 40, np.uint8)
        c1 = Q.pack_width(x, 1, count, e, sb, o1, 8, bits, stochastic, key)
        c2 = _client.packw(x, 1, count, e, sb, o2, 8, Q.NO_EXPONENT, Q.NONFINITE, bits,
                           stochastic, key)
        assert c1 == c2 and np.array_equal(o1, o2), trial
        f1, f2 = np.zeros(count + 2, np.float32), np.zeros(count + 2, np.float32)
        fac = 2.0 ** (e - sb)
        Q.dequantize_width_into(o1, 8, count, e, sb, f1, 2, 1.0, bits)
        _client.dequantw(o1, 8, count, fac, f2, 2, bits)
        assert np.array_equal(f1, f2), trial
    for args in [(0, 0, 0), (5, 2**32 - 1, 31), (2**64 - 1, 7, 255)]:
        assert Q.chunk_key(*args) == _client.chunk_key(*args)


def test_the_bound_of_each_width():
    """docs/precision.md: N = 4, S = bits - 4; nearest N 2^(e-S-1), stochastic twice."""
    assert [Q.scale_bits(4, b) for b in (32, 16, 8)] == [28, 12, 4]
    assert Q.scale_bits(4) == 28 == Q.scale_bits(4, 32)      # int32: as it always was
    assert Q.error_bound(0, 4, 8) == 4 * 2.0 ** -5
    assert Q.error_bound(0, 4, 8, stochastic=True) == 4 * 2.0 ** -4
    with pytest.raises(ValueError, match="wider precision"):
        Q.scale_bits(64, 8)


@pytest.mark.parametrize("text,want", [
    ("8", Precision(8)), ("int16", Precision(16)), ("32", Precision()),
    ("int8:stochastic:hadamard", Precision(8, "stochastic", True)),
    (" 16 : hadamard ", Precision(16, "nearest", True))])
def test_precision_parses(text, want):
    assert Precision.parse(text) == want
    assert Precision.parse(str(want)) == want


@pytest.mark.parametrize("bad", ["4", "int12", "", "8:fast", "eight"])
def test_a_bad_precision_is_a_one_line_error(bad):
    with pytest.raises(ValueError, match="precision") as e:
        Precision.parse(bad)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="precision"):
        as_precision(3.5)


def test_a_width_refusal_says_what_to_fix():
    from ina_fabric.host.transport import SwitchClient
    from ina_fabric.protocol.fields import Refusal, width_byte
    with SwitchClient(("127.0.0.1", 9), 1, 0, 2, session=5, precision=8) as c:
        c._prec = c.precision
        e = c._refused(Refusal.BAD_WIDTH, width_byte(16), 7, 10)
    assert "int16" in str(e) and "int8" in str(e) and "same precision" in str(e)


def test_a_narrow_call_keeps_as_many_bytes_in_flight():
    """The call window counts max_inflight_bytes at the call's width: an int8 call may
    have 4 x the int32 call's packets in flight (the same bytes), up to the job's window
    (a bench at 100 Mbit/s measured int8 window-bound at int32's packet count)."""
    from ina_fabric.host.transport import SwitchClient
    with SwitchClient(("127.0.0.1", 9), 1, 0, 2, window=256, elements=2048, session=5,
                      max_inflight_bytes=512 << 10) as c:
        assert [c.call_window(10_000, b) for b in (32, 16, 8)] == [64, 128, 256]
        c.window = 64
        assert c.call_window(10_000, 8) == 64
