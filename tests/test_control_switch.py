"""The joint controller's switch path (host/controller/switchpath.py): the precision knob
sets the element width on the wire (int32, int16, int8; int4 codes in int8 elements),
every rank gets the same sum within the stated bound, the bytes on a real loopback
switch shrink with the knob, and the meters (on a fake clock) give the cost model the
switch path's time per byte and fixed cost."""

import math
import threading

import numpy as np
import pytest

from ina_fabric.host.controller.costmodel import CostModel, JobParams
from ina_fabric.host.controller.knobs import ConfigError, Knobs, KnobSpace
from ina_fabric.host.controller.switchpath import (CompressedSwitchCollective, switch_payload_bytes,
                                                   wire_width)
from ina_fabric.host.transport import quantize as Q
from ina_fabric.host.transport.precision import as_precision

pytestmark = pytest.mark.timeout(240)


def test_wire_width_and_bytes_by_hand():
    # the knob's width is the wire's; int4 codes go as int8 while S >= 3 (N <= 8)
    assert [wire_width(q, 4) for q in (32, 16, 8, 4)] == [32, 16, 8, 8]
    assert [wire_width(q, 8) for q in (16, 8, 4)] == [16, 8, 8]
    assert wire_width(4, 9) == 16 and wire_width(8, 16) == 8    # int8 S = 2 at N = 16
    assert wire_width(8, 32) == 8 and wire_width(8, 33) == 16   # S = 1, then none
    assert switch_payload_bytes(1000, 4, 4) == 1000
    assert switch_payload_bytes(1001, 8, 4) == 1001
    assert switch_payload_bytes(1001, 16, 4) == 2002
    assert switch_payload_bytes(1000, 32, 4) == 4000
    with pytest.raises(ConfigError, match="must be one of"):
        wire_width(5, 4)
    with pytest.raises(ConfigError, match="no wire width"):
        wire_width(32, 2 ** 31)


class FakeClock:
    """Per-thread fake seconds: each rank's clock moves only by what its calls cost."""

    def __init__(self):
        self.local = threading.local()

    def __call__(self):
        return getattr(self.local, "t", 0.0)

    def advance(self, dt):
        self.local.t = self() + dt


class FakeSwitch:
    """Sums the N ranks' calls as the client and the switch do: each float32 value in
    fixed point at the call's width with the block exponent of its packet of
    ``elements`` (the max over the workers), S = bits - 2 - ceil(log2 N), rounded to
    nearest or stochastically (a numpy draw per rank: not the client's bits); every call
    costs ``latency + bytes / bandwidth`` on the fake clock, bytes at the call's width."""

    def __init__(self, world, clock, latency, bandwidth, elements=64):
        self.world, self.clock = world, clock
        self.latency, self.bandwidth, self.elements = latency, bandwidth, elements
        self.barrier = threading.Barrier(world)
        self.inputs = [None] * world
        self.result = None
        self.calls = 0
        self.widths = []
        self.rng = np.random.default_rng(7)

    def call(self, rank, x, precision):
        p = as_precision(precision)
        self.inputs[rank] = np.asarray(x, np.float32).copy()
        if self.barrier.wait() == 0:
            xs = np.stack(self.inputs).astype(np.float64)
            S = Q.scale_bits(self.world, p.bits)
            out = np.zeros(xs.shape[1], np.float64)
            for a in range(0, xs.shape[1], self.elements):
                blk = xs[:, a:a + self.elements]
                m = np.abs(blk).max()
                e = math.frexp(m)[1] if m > 0 else 0
                y = blk * 2.0 ** (S - e)
                q = np.floor(y + self.rng.random(y.shape)) if p.stochastic else np.rint(y)
                assert np.abs(q.sum(0)).max() <= 2 ** (p.bits - 2)
                out[a:a + self.elements] = q.sum(0) * 2.0 ** (e - S)
            self.result = out.astype(np.float32)
            self.calls += 1
            self.widths.append(p.bits)
        self.barrier.wait()
        self.clock.advance(self.latency + p.bits // 8 * np.size(x) / self.bandwidth)
        return self.result.copy()


class FakeClient:
    def __init__(self, switch, rank):
        self.switch, self.rank = switch, rank
        self.nworkers, self.elements = switch.world, switch.elements

    def allreduce(self, x, precision=None):
        return self.switch.call(self.rank, x, precision), {}


def _run(world, bits, xs, latency=0.004, bandwidth=1e6, calls=1, probe_every=10):
    clock = FakeClock()
    sw = FakeSwitch(world, clock, latency, bandwidth)
    colls = [CompressedSwitchCollective(r, world, FakeClient(sw, r), bits=bits, seed=3, clock=clock,
                              probe_every=probe_every) for r in range(world)]
    out = [None] * world

    def rank(r):
        for _ in range(calls):
            out[r] = colls[r].allreduce(xs[r])

    from conftest import run_threads
    errors = run_threads(rank, range(world))
    assert not errors, errors
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
    if bits in (32, 16, 8):
        # the client's fixed point at the wire width: N 2**(e - S) (stochastic) or half
        # of it (int32, nearest), e the packet's agreed exponent; plus float32 rounding
        bound = Q.error_bounds(xs, 64, bits, stochastic=bits != 32)
        slack = 1e-6 * (np.abs(np.asarray(xs, np.float64)).sum(0) + 1e-30)
        assert np.all(err <= bound + slack)
        if bits != 32:                  # the elements really are narrow
            assert err.max() > 0.01 * bound.max()
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
    # the payload call went at the wire width (after the int32 scale call and probe)
    assert colls[0].client.switch.widths == [32, 32, wire_width(bits, world)]
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
    latency from the fake-clock meters; the cost model's bytes are the wire width's."""
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
    # the bytes of the wire width: int16 2 per element, int8 and the int4 codes 1
    assert [p.comm_time(q) for q in (32, 16, 8)] == pytest.approx(
        [lat + b * n / bw for b in (4, 2, 1)])
    assert p.comm_time(4) == p.comm_time(8)
    # with the same bytes, int4's noise makes it never better than int8 on this path
    assert p.rate(Knobs(8, 1)) < p.rate(Knobs(4, 1))
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


def test_int4_codes_that_do_not_come_back_exact_raise():
    """The int4 codes' RESULT must be integers of [-N L, N L]: one that is not (a switch
    that rounded or saturated them) raises instead of being scaled into a wrong sum."""
    class Rounding(FakeClient):
        def allreduce(self, x, precision=None):
            out, st = super().allreduce(x, precision)
            return (out + 0.5 if as_precision(precision).bits == 8 else out), st

    clock = FakeClock()
    c = CompressedSwitchCollective(0, 1, Rounding(FakeSwitch(1, clock, 0, 1e6), 0), bits=4,
                                   clock=clock)
    with pytest.raises(ValueError, match="exact sum"):
        c.allreduce(np.linspace(-1, 1, 100).astype(np.float32))
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
    sw = figs(1.2)
    sw["levels"]["heavy"]["sim_best_setting"] = {"rate": "50mbit", "latency_s": 0.06,
                                                 "sim_decoupled_over_joint": 1.07}
    _write_real(_results, sw, "switch")
    rows = json.loads((tmp_path / "control_real.json").read_text())["figures"]["rows"]
    # the switch row carries the simulator's best setting beside the measurement
    assert [r["sim_best_setting"]["rate"] for r in rows if "sim_best_setting" in r] == [
        "50mbit"]
    assert {(r["path"], r["level"], r["decoupled_over_joint"]) for r in rows} == {
        ("gloo", "heavy", 1.035), ("switch", "heavy", 1.2)}
    assert all({"ci95_low", "ci95_high", "seeds"} <= set(r) for r in rows)
    _write_real(_results, figs(1.1), "switch")          # a second switch run replaces
    rows = json.loads((tmp_path / "control_real.json").read_text())["figures"]["rows"]
    assert sorted((r["path"], r["decoupled_over_joint"]) for r in rows) == [
        ("gloo", 1.035), ("switch", 1.1)]


def test_control_real_json_keeps_a_row_per_rate(tmp_path, monkeypatch):
    """A switch-path run at another link rate adds its row beside the first one's (it
    replaced it before the rows carried the rate); a file whose rows have no rate gets
    the rate of the run that wrote it, and a run at the same rate replaces its row."""
    import json
    from ina_fabric.bench import _results
    from ina_fabric.bench.bench_control import _write_real
    monkeypatch.setattr(_results, "RESULTS", tmp_path)

    def figs(m, rate):
        return {"setup": {"path": "switch", "rate": rate},
                "levels": {"heavy": {"decoupled_over_joint": m, "ci95_low": m - 0.1,
                                     "ci95_high": m + 0.1, "seeds": 3, "verdict": "x",
                                     "sim_decoupled_over_joint": m - 0.02}}}

    # as a switch run at 50 Mbit/s wrote it before the rows had a rate
    before = figs(1.07, "50mbit")
    before["rows"] = [{"path": "switch", "level": "heavy", "decoupled_over_joint": 1.07,
                       "ci95_low": 0.97, "ci95_high": 1.17, "seeds": 3}]
    (tmp_path / "control_real.json").write_text(json.dumps({"figures": before}))
    _write_real(_results, figs(1.02, "15mbit"), "switch")
    rows = json.loads((tmp_path / "control_real.json").read_text())["figures"]["rows"]
    assert sorted((r["rate"], r["decoupled_over_joint"]) for r in rows) == [
        ("15mbit", 1.02), ("50mbit", 1.07)]
    new = [r for r in rows if r["rate"] == "15mbit"][0]
    assert new["sim_decoupled_over_joint"] == pytest.approx(1.0)   # at this setting
    assert {"ci95_low", "ci95_high", "seeds", "level", "path"} <= set(new)
    _write_real(_results, figs(1.05, "15mbit"), "switch")   # same rate: replaces
    rows = json.loads((tmp_path / "control_real.json").read_text())["figures"]["rows"]
    assert sorted((r["rate"], r["decoupled_over_joint"]) for r in rows) == [
        ("15mbit", 1.05), ("50mbit", 1.07)]


def test_the_knob_sets_the_width_byte_and_the_bytes_shrink_on_a_real_switch():
    """Four ranks through a loopback ``SwitchServer`` (the Python model, whose every
    datagram is counted here by its ``width`` byte): the payload call of each knob
    goes at its wire width both ways (int16 half of int32's element bytes, int8 and the
    int4 codes a quarter), every rank gets the same sum, within the bound."""
    from ina_fabric.host.cluster import free_udp_ports
    from ina_fabric.host.switch import SwitchServer
    from ina_fabric.host.transport import SwitchClient
    from ina_fabric.protocol.fields import HEADER_BYTES, Flags
    from ina_fabric.protocol.jobtable import JobConfig

    world, n, E = 4, 6_000, 256
    ports = free_udp_ports(world)
    job = JobConfig(1, tuple(f"127.0.0.1:{p}" for p in ports), window=16, elements=E)
    server = SwitchServer([job], "127.0.0.1", 0, engine="model", key=None)
    seen = {"up": {}, "down": {}}
    process = server.model.process

    def counting(data, src, now):   # every datagram the switch takes and sends: its
        replies = process(data, src, now)    # element bytes, by its width byte
        for d, dgram in [("up", data)] + [("down", r) for _, r in replies]:
            if dgram[2] & Flags.RETRANSMIT:     # a re-send (a loaded machine's timer)
                continue
            bits = 32 >> (dgram[7] & 15)
            seen[d][bits] = seen[d].get(bits, 0) + len(dgram) - HEADER_BYTES
        return replies

    server.model.process = counting
    t = threading.Thread(target=server.serve_forever, args=(False,), daemon=True)
    t.start()
    rng = np.random.default_rng(5)
    xs = [(rng.standard_normal(n) * np.repeat(10.0 ** rng.uniform(-2, 0, 6), 1000)
           ).astype(np.float32) for _ in range(world)]
    knobs = (32, 16, 8, 4)
    outs = [[None] * len(knobs) for _ in range(world)]
    counts = []
    barrier = threading.Barrier(world)

    def rank(w):
        with SwitchClient(server.address, 1, w, world, 16, E,
                          bind=("127.0.0.1", ports[w]), session=job.session) as cl:
            coll = CompressedSwitchCollective(w, world, cl, seed=1, probe_every=1)
            coll.allreduce(xs[w])       # warm (the numba kernels load): not counted
            for k, q in enumerate(knobs):
                coll.set_precision(q)
                if barrier.wait() == 0:
                    counts.append({d: dict(v) for d, v in seen.items()})
                outs[w][k] = coll.allreduce(xs[w])
                barrier.wait()
            coll.close()

    from conftest import run_threads
    errors = run_threads(rank, range(world), timeout=120, on_error=barrier.abort)
    server.stop()
    t.join(2)
    counts.append({d: dict(v) for d, v in seen.items()})
    server.close()
    assert not errors, errors
    exact = np.sum(np.asarray(xs, np.float64), 0)
    slack = 1e-6 * (np.abs(np.asarray(xs, np.float64)).sum(0) + 1e-30)
    payload = {}
    for k, q in enumerate(knobs):
        width = wire_width(q, world)
        for w in range(world):
            np.testing.assert_array_equal(outs[w][k][0], outs[0][k][0])   # replicas
            assert outs[w][k][1]["width"] == width
        # the element bytes at the payload's width in this call: N ranks' DATA, a
        # RESULT to each (unicast) per packet
        for d in ("up", "down"):
            payload.setdefault(d, {})[q] = counts[k + 1][d].get(width, 0) - \
                counts[k][d].get(width, 0)
        err = np.abs(outs[0][k][0].astype(np.float64) - exact)
        if q in (32, 16, 8):
            bound = Q.error_bounds(xs, E, q, stochastic=q != 32)
            assert np.all(err <= bound + slack), (q, float((err / bound).max()))
        else:
            cmax = np.repeat(np.max([np.abs(x).reshape(-1, 1000).max(1) for x in xs], 0),
                             1000)
            assert np.all(err <= world * world * 1.001 * cmax / 7)
    for d in ("up", "down"):
        for q in knobs:     # the payload's element bytes, sent once (re-sends not counted)
            want = world * n * wire_width(q, world) // 8
            if q == 32:     # the scale call and the probe are int32 too
                want += world * 4 * (2 * -(-6 // E) * E + 1 + 1)
            assert want <= payload[d][q] <= 1.3 * want, (d, q, payload[d][q], want)
    # the knob shrinks them: int16 half of int32, int8 and the int4 codes a quarter
    assert payload["up"][16] * 1.9 < payload["up"][32]
    assert payload["up"][8] * 3.5 < payload["up"][32]
