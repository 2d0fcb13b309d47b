"""The joint controller's switch path (host/controller/switchpath.py): narrow codes packed
into the switch's 32-bit containers sum exactly, every rank gets the same sum within the
stated bound, and the meters (on a fake clock) give the cost model the switch path's
time per byte and fixed cost."""

import math
import threading

import numpy as np
import pytest

from ina_fabric.host.controller.costmodel import CostModel, JobParams
from ina_fabric.host.controller.knobs import ConfigError, Knobs, KnobSpace
from ina_fabric.host.controller.switchpath import (CompressedSwitchCollective, codes_per_container,
                                                   pack, switch_payload_bytes, unpack)

pytestmark = pytest.mark.timeout(240)


def test_codes_per_container_and_bytes_by_hand():
    # N = 4: 2 bits of headroom, 24 usable bits: int4 -> 6-bit fields (4), int8 -> 10 (2)
    assert [codes_per_container(q, 4) for q in (32, 16, 8, 4)] == [1, 1, 2, 4]
    assert [codes_per_container(q, 2) for q in (16, 8, 4)] == [1, 2, 4]
    assert codes_per_container(4, 16) == 3          # 8-bit fields
    assert switch_payload_bytes(1000, 4, 4) == 4 * 250
    assert switch_payload_bytes(1001, 8, 4) == 4 * 501
    assert switch_payload_bytes(1000, 32, 4) == 4000
    with pytest.raises(ConfigError, match="must be one of"):
        codes_per_container(5, 4)
    with pytest.raises(ConfigError, match="more than the 24"):
        codes_per_container(16, 512)


@pytest.mark.parametrize("bits", [16, 8, 4])
@pytest.mark.parametrize("workers", [2, 3, 4, 8])
def test_packed_codes_sum_exactly_in_float32_containers(bits, workers):
    rng = np.random.default_rng(bits * 100 + workers)
    L = 2 ** (bits - 1) - 1
    n = 1001
    codes = [rng.integers(-L, L + 1, n) for _ in range(workers)]
    codes[0][:5] = L           # the extremes of every field
    codes[1][:5] = L
    codes[0][5:10] = -L
    summed = np.zeros(-(-n // codes_per_container(bits, workers)), np.float32)
    for c in codes:
        summed += pack(c, bits, workers)      # float32 adds: exact below 2**24
    np.testing.assert_array_equal(unpack(summed, n, bits, workers), np.sum(codes, 0))


def test_unpack_refuses_a_sum_that_did_not_come_through_exactly():
    with pytest.raises(ValueError, match="not an exact packed integer"):
        unpack(np.array([1.5], np.float32), 2, 8, 4)
    with pytest.raises(ValueError, match="not an exact packed integer"):
        unpack(np.array([2.0 ** 25], np.float32), 2, 8, 4)
    with pytest.raises(ValueError, match="outside"):
        pack(np.array([8]), 4, 4)


class FakeClock:
    """Per-thread fake seconds: each rank's clock moves only by what its calls cost."""

    def __init__(self):
        self.local = threading.local()

    def __call__(self):
        return getattr(self.local, "t", 0.0)

    def advance(self, dt):
        self.local.t = self() + dt


class FakeSwitch:
    """Sums the N ranks' calls as the switch path does: each float32 value in int32 fixed
    point with the block exponent of its packet of ``elements`` (the max over the
    workers), S = 30 - ceil(log2 N); every call costs ``latency + 4 n / bandwidth`` on
    the fake clock."""

    def __init__(self, world, clock, latency, bandwidth, elements=64):
        self.world, self.clock = world, clock
        self.latency, self.bandwidth, self.elements = latency, bandwidth, elements
        self.barrier = threading.Barrier(world)
        self.inputs = [None] * world
        self.result = None
        self.calls = 0

    def call(self, rank, x):
        self.inputs[rank] = np.asarray(x, np.float32).copy()
        if self.barrier.wait() == 0:
            xs = np.stack(self.inputs).astype(np.float64)
            S = 30 - math.ceil(math.log2(self.world))
            out = np.zeros(xs.shape[1], np.float64)
            for a in range(0, xs.shape[1], self.elements):
                blk = xs[:, a:a + self.elements]
                m = np.abs(blk).max()
                e = math.frexp(m)[1] if m > 0 else 0
                q = np.rint(blk * 2.0 ** (S - e))
                assert np.abs(q.sum(0)).max() < 2 ** 31
                out[a:a + self.elements] = q.sum(0) * 2.0 ** (e - S)
            self.result = out.astype(np.float32)
            self.calls += 1
        self.barrier.wait()
        self.clock.advance(self.latency + 4 * np.size(x) / self.bandwidth)
        return self.result.copy()


class FakeClient:
    def __init__(self, switch, rank):
        self.switch, self.rank = switch, rank
        self.nworkers, self.elements = switch.world, switch.elements

    def allreduce(self, x):
        return self.switch.call(self.rank, x), {}


def _run(world, bits, xs, latency=0.004, bandwidth=1e6, calls=1, probe_every=10):
    clock = FakeClock()
    sw = FakeSwitch(world, clock, latency, bandwidth)
    colls = [CompressedSwitchCollective(r, world, FakeClient(sw, r), bits=bits, seed=3, clock=clock,
                              probe_every=probe_every) for r in range(world)]
    out = [None] * world

    def rank(r):
        for _ in range(calls):
            out[r] = colls[r].allreduce(xs[r])

    th = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in th:
        t.start()
    for t in th:
        t.join(60)
    return colls, out


@pytest.mark.parametrize("bits", [32, 16, 8, 4])
def test_every_rank_gets_the_same_sum_within_the_bound(bits):
    world, n, chunk = 3, 5000, 1024
    rng = np.random.default_rng(bits)
    # chunks whose scales differ by 1000x, as a model's layers do
    mag = np.repeat(10.0 ** rng.uniform(-3, 0, -(-n // chunk)), chunk)[:n]
    xs = [(rng.standard_normal(n) * mag).astype(np.float32) for _ in range(world)]
    colls, out = _run(world, bits, xs)
    sums = [o[0] for o in out]
    for s in sums[1:]:
        np.testing.assert_array_equal(s, sums[0])
    exact = np.sum(np.asarray(xs, np.float64), 0)
    err = np.abs(sums[0] - exact)
    cmax = np.max([np.abs(np.pad(x, (0, -n % chunk))).reshape(-1, chunk).max(1)
                   for x in xs], 0)
    cmax = np.repeat(cmax, chunk)[:n]
    if bits == 32:
        bound = world * 2.0 ** -(30 - 2) * np.abs(exact).max() + 1e-6 * np.abs(exact)
        assert np.all(err <= bound + 1e-7)
    else:
        L = 2 ** (bits - 1) - 1
        # each worker's code is off by less than one step; the step is at most
        # N**(1/4) times max / L where the chunk's max**4 is resolved in its packet of
        # the scale call, N times max / L where it is not
        big = cmax >= 0.1 * cmax.max()          # 1e-4 of the packet's largest 4th power
        step = np.where(big, world ** 0.25, world) * 1.001 * cmax / L
        assert np.all(err <= world * step)
        # and the error is not trivially zero: the codes really are narrow
        assert err.max() > 0.01 * step.max()
    m = colls[0].take_measurements()
    assert m["clipped"] == 0
    assert m["bytes"] == switch_payload_bytes(n, bits, world)


def test_the_narrow_sum_is_unbiased():
    world, n = 2, 4096
    x = np.full(n, 0.3, np.float32)
    x[0] = 1.0                       # the chunk's max: scale ~ 1.19 / 7 at int4
    colls, out = _run(world, 4, [x, x])
    s = out[0][0]
    # each element of the sum is 0.6 plus zero-mean rounding noise of at most 2 steps
    assert abs(float(s[1:].mean()) - 0.6) < 0.01
    assert np.unique(s[1:]).size > 1


def test_meters_give_the_switch_path_time_per_byte_and_fixed_cost_on_a_fake_clock():
    world, n, lat, bw = 4, 40_000, 0.004, 2e6
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(world)]
    colls, _ = _run(world, 8, xs, latency=lat, bandwidth=bw, calls=3, probe_every=2)
    m = colls[0].take_measurements()
    assert m["calls"] == 3
    sent = switch_payload_bytes(n, 8, world)
    assert m["bytes"] == 3 * sent
    # payload: lat + bytes/bw; the probe (1 element) measured lat + 4/bw
    fixed = lat + 4 / bw
    assert m["fixed_s"] == pytest.approx(3 * fixed)
    assert m["seconds"] == pytest.approx(3 * (lat + sent / bw))
    assert m["bytes"] / m["byte_s"] == pytest.approx(bw, rel=1e-3)
    # the scale call: latency and (chunks + a packet of its own) elements
    head = 4 * (2 * 64 + 1) / bw   # 40 max**4, 40 max, each padded to a packet; |g|^2
    assert m["sync_s"] == pytest.approx(3 * (lat + head))
    assert m["rq_n"] == 1 and m["rq_sum"][4] > m["rq_sum"][8] > m["rq_sum"][16] > 0
    # |g|^2 of the workers, averaged
    assert m["small_sq"] / 3 == pytest.approx(
        np.mean([float(x.astype(np.float64) @ x) for x in xs]), rel=1e-5)


def test_the_controller_learns_the_switch_path_online_and_prices_its_bytes():
    """RealController (bench/experiments/realrun.py) on the switch path: bandwidth and
    latency from the fake-clock meters; the cost model's bytes are the packed ones."""
    from ina_fabric.bench.experiments.realrun import RealController, RealSpec

    class Cfg:
        workers = 4

    world, n, lat, bw = 4, 40_000, 0.004, 2e6
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(world)]
    spec = RealSpec(controller="joint", capacity=1e7, throttle=False, path="switch",
                    accums=(1, 2, 4))
    ctl = RealController(Cfg(), spec)
    colls, _ = _run(world, 32, xs, latency=lat, bandwidth=bw, calls=2, probe_every=1)
    for c in colls[1:]:
        c.close()
    from ina_fabric.host.controller import compress
    compress._CURRENT["c"] = colls[0]        # rank 0's, as in its own process
    assert ctl.on_step({"step": 2, "epoch": 0, "time": 0.5, "train_seconds": 0.5,
                        "loss": 2.0, "compute_seconds": 0.5, "batch": 32}) != {}
    e = ctl.log[-1]
    assert e["bandwidth"] == pytest.approx(bw, rel=1e-3)
    # per step: the scale call (sync) + the probe's fixed cost (+ codec, ~0 here)
    assert e["latency"] == pytest.approx(
        (lat + 4 * 129 / bw) + (lat + 4 / bw), rel=0.05, abs=2e-4)
    p = CostModel(JobParams(params=n, workers=4, micro_batch=8, t_compute=0.0,
                            bandwidth=bw, b_noise=64, path="switch", latency=lat))
    assert p.comm_time(4) == pytest.approx(lat + 4 * n / 4 / bw)
    assert p.comm_time(16) == p.comm_time(32)     # int16 packs one per container
    # with the same bytes, int16's noise makes it never better than 32 on this path
    assert p.rate(Knobs(32, 1)) < p.rate(Knobs(16, 1))
    g = CostModel(p.p.with_(path="gloo", wire_factor=3.0))
    assert g.comm_time(4) > p.comm_time(4)
    with pytest.raises(ConfigError, match="path="):
        JobParams(params=1, workers=1, micro_batch=1, t_compute=0, bandwidth=1, b_noise=0,
                  path="carrier-pigeon")
    colls[0].close()


def test_the_switch_path_refuses_a_pace_and_bad_precisions():
    clock = FakeClock()
    c = CompressedSwitchCollective(0, 1, FakeClient(FakeSwitch(1, clock, 0, 1e6), 0), clock=clock)
    with pytest.raises(ConfigError, match="unpaced"):
        c.set_pace(0.5)
    c.set_pace(1.0)
    with pytest.raises(ConfigError, match="must be one of"):
        c.set_precision(12)
    with pytest.raises(ValueError, match="non-finite"):
        c.allreduce(np.array([np.nan], np.float32))
    c.close()


@pytest.mark.slow
def test_real_training_through_a_real_switch_at_int4_and_fp32():
    """digits on 2 workers through ``ina switch`` (the software switch, loopback): the
    switch path is what the run used (no fallback), the int4 payload is 4x smaller than
    fp32's, and every rank ends with the same parameters."""
    import multiprocessing as mp
    import os
    from ina_fabric.host.cluster import start_switch_process
    from ina_fabric.bench.experiments.realrun import RealSpec, real_run
    addr, proc = start_switch_process(mp.get_context("spawn"))
    old = os.environ.get("INA_SWITCH")
    os.environ["INA_SWITCH"] = f"{addr[0]}:{addr[1]}"
    try:
        sent = {}
        for q in (32, 4):
            spec = RealSpec(controller="static", throttle=False, path="switch",
                            script=[(0, q, 1)])
            res = real_run(spec, workload="digits", workers=2, seed=0, max_epochs=1,
                           max_steps=8, timeout=200)
            assert res.steps == 8 and res.fallbacks == 0
            assert len(set(res.param_hashes)) == 1
            sent[q] = res.stats["bytes"]
        assert sent[4] * 4 == pytest.approx(sent[32], rel=0.01)
    finally:
        if old is None:
            os.environ.pop("INA_SWITCH", None)
        else:
            os.environ["INA_SWITCH"] = old
        proc.terminate()
        proc.join(5)


def test_control_real_json_keeps_a_row_per_path_and_level(tmp_path, monkeypatch):
    """A switch-path lab run adds its rows beside the Gloo path's (and a file from
    before the rows gives its levels as Gloo rows)."""
    import json
    from ina_fabric.bench import _results
    from ina_fabric.bench.bench_control import _write_real
    monkeypatch.setattr(_results, "RESULTS", tmp_path)

    def figs(m):
        return {"levels": {"heavy": {"decoupled_over_joint": m, "ci95_low": m - 0.1,
                                     "ci95_high": m + 0.1, "seeds": 3, "verdict": "x"}}}

    old = figs(1.035)                       # as issue 23's runs wrote it, no rows
    (tmp_path / "control_real.json").write_text(json.dumps({"figures": old}))
    _write_real(_results, figs(1.2), "switch")
    rows = json.loads((tmp_path / "control_real.json").read_text())["figures"]["rows"]
    assert {(r["path"], r["level"], r["decoupled_over_joint"]) for r in rows} == {
        ("gloo", "heavy", 1.035), ("switch", "heavy", 1.2)}
    assert all({"ci95_low", "ci95_high", "seeds"} <= set(r) for r in rows)
    _write_real(_results, figs(1.1), "switch")          # a second switch run replaces
    rows = json.loads((tmp_path / "control_real.json").read_text())["figures"]["rows"]
    assert sorted((r["path"], r["decoupled_over_joint"]) for r in rows) == [
        ("gloo", 1.035), ("switch", 1.1)]
