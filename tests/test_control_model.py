"""Cost model, noise-scale estimator, controllers, contention traces, simulator, and bad
configuration (host/controller)."""

import math

import numpy as np
import pytest

from ina_fabric.bench.experiments.contention import BackgroundJob, BandwidthTrace, background_trace
from ina_fabric.host.controller.controllers import (CONTROLLERS, Decoupled, Joint, Telemetry,
                                      make_controller)
from ina_fabric.host.controller.costmodel import CostModel, JobParams, model_quant_ratio, payload_bytes
from ina_fabric.host.controller.knobs import ConfigError, Knobs, KnobSpace
from ina_fabric.host.controller.measure import BandwidthMeter, Ewma, NoiseScaleEstimator
from ina_fabric.bench.experiments.simulate import paper_scenario, simulate


def small(**kw):
    p = dict(params=1000, workers=4, micro_batch=8, t_compute=0.01, bandwidth=1000.0,
             b_noise=64.0, s_min=100.0, wire_factor=3.0, overlap=0.5,
             quant_ratio={8: 0.04})
    p.update(kw)
    return CostModel(JobParams(**p))


# ---- cost model on hand-computed cases ----------------------------------------------

def test_payload_bytes_by_hand():
    assert payload_bytes(1000, 32) == 4000
    assert payload_bytes(1000, 16) == 2000 + 4
    assert payload_bytes(1000, 8) == 1000 + 4
    assert payload_bytes(1001, 4) == 501 + 4          # odd count rounds up
    assert payload_bytes(2048, 8, chunk=1024) == 2048 + 8


def test_step_time_and_time_to_target_by_hand():
    m = small()
    k = Knobs(8, 2)
    # comm = 3 * 1004 B / 1000 B/s = 3.012 s; overlap hides 0.5 * 0.01 s
    assert m.comm_time(8) == pytest.approx(3.012)
    assert m.step_time(k) == pytest.approx(2 * 0.01 + 3.012 - 0.005)
    # B = 2*8*4 = 64; rho = 0.04/4 * (1 + 64/16) = 0.05; S = 100 * (1 + 1 + 0.05)
    assert m.batch(k) == 64
    assert m.quant_noise(k) == pytest.approx(0.05)
    assert m.steps_to_target(k) == pytest.approx(205.0)
    assert m.time_to_target(k) == pytest.approx(205.0 * 3.027)
    assert m.effective_noise_scale(k) == pytest.approx(64 + 64 * 0.05)
    # float32: no quantization noise, 4 bytes per element
    k32 = Knobs(32, 1)
    assert m.quant_noise(k32) == 0.0
    assert m.step_time(k32) == pytest.approx(0.01 + 12.0 - 0.005)
    assert m.steps_to_target(k32) == pytest.approx(100 * (1 + 64 / 32))


def test_overlap_never_hides_more_than_the_transfer():
    m = small(bandwidth=1e12, overlap=1.0)
    assert m.step_time(Knobs(32, 1)) == pytest.approx(0.01)


def test_modelled_quantization_ratio():
    assert model_quant_ratio(4, kappa2=6 * 49) == pytest.approx(1.0)
    assert model_quant_ratio(8, kappa2=6 * 127 ** 2) == pytest.approx(1.0)
    assert model_quant_ratio(32) == 0.0
    # measured ratios override the model
    assert small().quant_ratio(8) == 0.04
    assert small().quant_ratio(4) == pytest.approx(model_quant_ratio(4))


def test_table_is_time_to_target_per_pair():
    m, sp = small(), KnobSpace()
    t = m.table(sp)
    assert t.shape == (len(sp.precisions), len(sp.accums))
    assert t[sp.precisions.index(8), sp.accums.index(2)] == pytest.approx(205.0 * 3.027)


# ---- noise-scale estimator on synthetic gradients with known noise ------------------

@pytest.mark.parametrize("b_noise", [50.0, 400.0])
def test_noise_scale_estimator_recovers_known_noise(b_noise):
    rng = np.random.default_rng(1)
    D, b, N = 2000, 8, 8
    G = rng.standard_normal(D)
    G *= 1.0 / np.linalg.norm(G)                  # |G|^2 = 1, so tr(Sigma) = b_noise
    est = NoiseScaleEstimator(beta=0.99)
    for _ in range(400):
        # per-sample noise covariance (b_noise / D) I; worker means over b samples
        workers = G + rng.standard_normal((N, D)) * math.sqrt(b_noise / (D * b))
        est.record(b, float(workers[0] @ workers[0]), b * N,
                   float(np.square(workers.mean(0)).sum()))
    assert est.value == pytest.approx(b_noise, rel=0.15)
    assert est.grad_sq == pytest.approx(1.0, rel=0.1)


def test_noise_scale_from_per_example_gradients_of_a_real_problem():
    """Least squares: per-example gradients are known exactly, so tr(Sigma)/|G|^2 is
    computed directly and compared with the estimate from micro-batch gradient norms."""
    rng = np.random.default_rng(2)
    n, d = 20000, 50
    X = rng.standard_normal((n, d))
    y = X @ rng.standard_normal(d) + rng.standard_normal(n)
    w = np.zeros(d) + 0.3                                      # a point mid-training
    per = (X @ w - y)[:, None] * X                             # per-example gradients
    G = per.mean(0)
    truth = np.trace(np.cov(per.T)) / (G @ G)
    est = NoiseScaleEstimator(beta=0.995)
    b, N = 16, 8
    for _ in range(1500):
        idx = rng.choice(n, (N, b))
        g = per[idx].mean(1)
        est.record(b, float(g[0] @ g[0]), b * N, float(np.square(g.mean(0)).sum()))
    assert est.value == pytest.approx(truth, rel=0.2)


def test_estimator_needs_two_batch_sizes():
    with pytest.raises(ValueError, match="b_small < b_big"):
        NoiseScaleEstimator().record(8, 1.0, 8, 1.0)
    assert NoiseScaleEstimator().value is None


def test_meters():
    bw = BandwidthMeter()
    bw.record(1000, 0.5)
    bw.record(3000, 1.5)
    assert bw.value == pytest.approx(2000.0)
    with pytest.raises(ValueError):
        bw.record(10, 0.0)
    e = Ewma(0.5)
    assert e.value is None and e.update(4.0) == 4.0


# ---- controllers ------------------------------------------------------------------

def thin_link():
    """Built so the combination matters: a thin shared link. Alone, the precision rule
    picks int4 (at a=1) and the accumulation rule, assuming float32, picks a large a to
    amortize a slow transfer; once gradients are 8x smaller that accumulation only wastes
    compute, and the joint argmin takes much less of it."""
    return CostModel(JobParams(params=774_000_000, workers=8, micro_batch=8, t_compute=0.27,
                               bandwidth=1.25e9 * 0.5, b_noise=256.0, overlap=0.5,
                               kappa2=30.0))


def test_joint_differs_from_decoupled_where_the_combination_matters():
    m, sp = thin_link(), KnobSpace()
    joint, dec = Joint(sp).propose(m), Decoupled(sp).propose(m)
    assert dec == Knobs(4, 8)
    assert joint == Knobs(4, 2)
    # joint is the exhaustive argmin, and strictly better than the combination
    brute = min(sp.all(), key=m.rate)
    assert joint == brute
    assert m.time_to_target(dec) / m.time_to_target(joint) > 1.2


def test_one_knob_controllers_keep_the_other_knob_at_default():
    m, sp = thin_link(), KnobSpace()
    assert make_controller("precision-only", sp).propose(m) == Knobs(4, 1)
    assert make_controller("accumulation-only", sp).propose(m) == Knobs(32, 8)
    assert make_controller("static", sp).propose(m) == sp.default
    assert set(CONTROLLERS) == {"static", "precision-only", "accumulation-only",
                                "decoupled", "joint"}


def test_joint_agrees_with_decoupled_when_one_knob_is_enough():
    m = thin_link().p.with_(bandwidth=1e15)        # network free: nothing to trade
    m = CostModel(m)
    assert Joint().propose(m) == Decoupled().propose(m) == Knobs(32, 1) or \
        m.rate(Joint().propose(m)) == pytest.approx(m.rate(Decoupled().propose(m)), rel=1e-3)


def test_hysteresis_keeps_joint_from_flapping():
    sp = KnobSpace(precisions=(32, 8), accums=(1,))
    c = Joint(sp, hysteresis=0.05, dwell=0)
    base = JobParams(params=1000, workers=4, micro_batch=8, t_compute=1.0, bandwidth=1.0,
                     b_noise=0.0, quant_ratio={8: 0.0})
    # compute-dominated steps: fp32 and int8 within 1e-5 of each other, measured
    # bandwidth jittering by +-1% each interval
    for i in range(20):
        bw = 1e6 * (1 + 0.01 * (-1) ** i)          # +-1% noise around a near tie
        m = CostModel(base.with_(bandwidth=bw, latency=1.0, t_compute=1000.0))
        c.decide(m)
    assert c.changes == 0
    # a real change of conditions does switch it
    c.decide(CostModel(base.with_(bandwidth=1000.0)))
    assert c.current == Knobs(8, 1) and c.changes == 1


def test_telemetry_builds_the_model_from_measurements():
    tel = Telemetry(base=thin_link().p)
    tel.bandwidth.record(1e9, 1.0)
    tel.compute.record(0.5, 2)
    tel.quant.record(4, 0.5)
    p = tel.params()
    assert p.bandwidth == pytest.approx(1e9) and p.t_compute == pytest.approx(0.25)
    assert p.quant_ratio[4] == pytest.approx(0.5)
    assert p.b_noise == thin_link().p.b_noise        # not measured yet: the prior


# ---- bad configuration ----------------------------------------------------------------

def test_empty_knob_set_rejected():
    with pytest.raises(ConfigError, match="empty knob set"):
        KnobSpace(precisions=())
    with pytest.raises(ConfigError, match="empty knob set"):
        KnobSpace(accums=[])
    with pytest.raises(ConfigError, match="empty knob set"):
        small().best([])


def test_negative_bandwidth_rejected():
    with pytest.raises(ConfigError, match=r"bandwidth=-5.0: must be > 0 bytes/s"):
        small(bandwidth=-5.0)
    with pytest.raises(ConfigError, match="bandwidth"):
        small(bandwidth=float("nan"))
    with pytest.raises(ConfigError, match="every rate must be > 0"):
        BandwidthTrace([0.0, 1.0], [10.0, -1.0])
    with pytest.raises(ConfigError, match="capacity"):
        background_trace(-1.0, BackgroundJob(1.0, 1.0), [(0, 1)], 10.0)


def test_other_bad_configuration_rejected():
    with pytest.raises(ConfigError, match="precision 12"):
        Knobs(12, 1)
    with pytest.raises(ConfigError, match="accumulation"):
        Knobs(32, 0)
    with pytest.raises(ConfigError, match="not in the knob set"):
        KnobSpace(precisions=(8, 4))               # default fp32 missing
    with pytest.raises(ConfigError, match="overlap"):
        small(overlap=1.5)
    with pytest.raises(ConfigError, match="workers"):
        small(workers=0)
    with pytest.raises(ConfigError, match="unknown controller"):
        make_controller("magic")
    with pytest.raises(ConfigError, match="hysteresis"):
        Joint(hysteresis=-0.1)


# ---- contention and the simulator ---------------------------------------------------------

def test_transfer_time_over_a_piecewise_rate_by_hand():
    tr = BandwidthTrace([0.0, 1.0, 3.0], [10.0, 5.0, 20.0])
    assert tr.transfer_end(0.0, 15.0) == pytest.approx(2.0)     # 10 B in 1 s, 5 B in 1 s
    assert tr.transfer_end(0.5, 5.0 + 10.0 + 20.0) == pytest.approx(4.0)
    assert tr.mean_rate(0.0, 3.0) == pytest.approx(20.0 / 3)
    assert BandwidthTrace.constant(7.0).transfer_end(100.0, 14.0) == pytest.approx(102.0)


def test_more_background_jobs_leave_less_bandwidth():
    job = BackgroundJob(grad_bytes=4e9, t_compute=0.35)
    shares = [background_trace(12.5e9, job, [(0.0, n)], 300.0, seed=3).mean_rate(0, 300) /
              12.5e9 for n in (0, 1, 2, 4)]
    assert shares[0] == 1.0
    assert shares[0] > shares[1] > shares[2] > shares[3] > 0.1
    # a changing schedule: no background job before t=50, four after
    tr = background_trace(12.5e9, job, [(0.0, 0), (50.0, 4)], 100.0, seed=3)
    assert tr.mean_rate(0, 50) == 12.5e9 and tr.mean_rate(50, 100) < 0.5 * 12.5e9


def test_simulator_runs_controllers_to_target():
    sc = paper_scenario(kappa2=30.0, s_min=60.0, control_interval=5.0)
    sc.job = sc.job.with_(bandwidth=1.25e9)
    trace = background_trace(1.25e9, sc.background, [(0.0, 2)], 5000.0, seed=0)
    res = {n: simulate(make_controller(n, sc.space), sc, trace, seed=0)
           for n in ("static", "decoupled", "joint")}
    assert res["joint"].time_to_target < res["decoupled"].time_to_target
    assert res["joint"].time_to_target < res["static"].time_to_target
    assert res["static"].changes == 0 and res["joint"].changes >= 1
    assert len(res["joint"].log["t"]) == res["joint"].steps


def test_cli_rejects_bad_configuration_with_one_line():
    from ina_fabric.host.cli import main
    assert main(["control", "model", "--precisions", ""]) == 2
    assert main(["control", "model", "--bandwidth", "-1"]) == 2
    assert main(["control", "model", "--bandwidth", "6.25e8", "--b-noise", "256"]) == 0
    assert main(["control", "model", "--rate-price", "-1"]) == 2
    assert main(["control", "model", "--rate-price", "1", "--paces", "0.5"]) == 2   # no 1
    assert main(["control", "model", "--rate-price", "1", "--paces", "x"]) == 2


def test_cli_model_with_the_pace_knob(capsys):
    from ina_fabric.host.cli import main
    assert main(["control", "model", "--bandwidth", "1.25e9", "--rate-price", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("cost to target relative to the best") == 3
    assert "best: int4/a=2/pace=0.5" in out
    assert main(["control", "model", "--bandwidth", "1.25e9"]) == 0
    out = capsys.readouterr().out
    assert "time to target" in out and "best: int4/a=2\n" in out


def test_compute_meter_does_not_average_in_the_warm_up_interval():
    """The first control interval (first passes, first exchange's set-up) measured up to
    0.7 s per micro-step on the lab, against 0.025 s after it. It stands alone until the
    next sample, then drops out; averaged in (before), the estimate after the second
    sample was 0.325 s, 13x too high, and decayed over tens of intervals."""
    from ina_fabric.host.controller.measure import ComputeMeter
    m = ComputeMeter()
    assert m.value is None
    m.record(3.5, 5)                        # warm-up: 0.7 s a micro-step
    assert m.value == pytest.approx(0.7)    # the only sample so far
    m.record(0.125, 5)
    assert m.value == pytest.approx(0.025)
    m.record(0.25, 5)                       # then the usual smoothing
    assert 0.025 < m.value < 0.05
    assert ComputeMeter(warmup=0).value is None
    with pytest.raises(ValueError, match="warm-up"):
        ComputeMeter(warmup=-1)


def test_real_controller_keeps_codec_and_step_overhead_out_of_compute(monkeypatch):
    """The real runs' meters, by hand. Five optimizer steps at a = 2: backward() took 1.0 s
    in all, of which the exchange 0.3 s (sync 0.1, fixed 0.05, payload 0.15) and the codec
    0.1 s; the steps took 1.5 s of wall time, so 0.5 s went outside forward and backward.
    Compute is then (1.0 - 0.3 - 0.1) / 10 micro-steps = 60 ms, and the cost model's
    per-step latency (0.1 + 0.05 + 0.1) / 5 + 0.5 / 5 = 150 ms. Before, the codec was
    charged per micro-step (70 ms) and the 0.5 s not at all (latency 30 ms)."""
    from ina_fabric.host.controller import compress
    from ina_fabric.bench.experiments import realrun

    class Fake:
        def take_measurements(self):
            return {"bytes": 30_000, "seconds": 0.15, "calls": 5, "elements": 5000,
                    "sync_s": 0.1, "fixed_s": 0.05, "byte_s": 0.1, "codec_s": 0.1,
                    "small_sq": 5.0, "big_sq": 2.5, "rq_sum": {}, "rq_n": 0}

    monkeypatch.setattr(compress, "current_collective", lambda: Fake())

    class Cfg:
        workers = 4

    ctl = realrun.RealController(Cfg(), realrun.RealSpec(controller="static", accums=(1, 2),
                                                         throttle=False))
    ctl.knobs = Knobs(32, 2)
    ctl.on_step({"step": 5, "epoch": 0, "time": 2.0, "train_seconds": 1.5,
                 "compute_seconds": 1.0, "loss": 1.0, "batch": 32})
    entry = ctl.log[-1]
    assert entry["t_compute"] == pytest.approx(0.06)
    assert entry["latency"] == pytest.approx(0.15)
    assert entry["codec_s"] == pytest.approx(0.1) and entry["overhead_s"] == pytest.approx(0.5)


# ---- the pace knob ----------------------------------------------------------------------

def test_pace_knob_is_checked():
    for bad in (0, 0.0, 1.5, -0.25, float("nan"), "1"):
        with pytest.raises(ConfigError, match="pace"):
            Knobs(32, 1, bad)
    with pytest.raises(ConfigError, match="empty knob set: no pace"):
        KnobSpace(paces=())
    with pytest.raises(ConfigError, match="duplicate"):
        KnobSpace(paces=(1.0, 0.5, 0.5))
    with pytest.raises(ConfigError, match="not in the knob set"):
        KnobSpace(paces=(0.5,))                   # the default (unpaced) missing
    sp = KnobSpace(precisions=(32, 4), accums=(1, 2), paces=(1.0, 0.5))
    assert len(sp.all()) == 8 and Knobs(4, 2, 0.5) in sp.all()
    assert str(Knobs(4, 2, 0.5)) == "int4/a=2/pace=0.5" and str(Knobs(4, 2)) == "int4/a=2"
    with pytest.raises(ConfigError, match="rate_price"):
        JobParams(params=10, workers=2, micro_batch=1, t_compute=0.1, bandwidth=1e6,
                  b_noise=1.0, rate_price=-1.0)


def test_pace_in_the_cost_model_by_hand():
    """1e6 fp32 elements (4 MB) to 1 peer; share 100 MB/s of a 400 MB/s link; compute
    0.1 s, no overlap. Paced at 0.5 the cap (200 MB/s) is above the share: no change; at
    0.125 (50 MB/s) the transfer takes 0.08 s instead of 0.04 s. The price multiplies."""
    m = CostModel(JobParams(params=1_000_000, workers=2, micro_batch=4, t_compute=0.1,
                            bandwidth=100e6, b_noise=0.0, link_rate=400e6, rate_price=2.0))
    assert m.comm_time(32, 1.0) == pytest.approx(0.04)
    assert m.comm_time(32, 0.5) == pytest.approx(0.04)
    assert m.comm_time(32, 0.125) == pytest.approx(0.08)
    assert m.step_time(Knobs(32, 1, 0.125)) == pytest.approx(0.18)
    assert m.price(Knobs(32, 1, 0.125)) == pytest.approx(1.25)
    assert m.rate(Knobs(32, 1, 0.125)) == pytest.approx(0.18 * 1.25)
    assert m.rate(Knobs(32, 1, 1.0)) == pytest.approx(0.14 * 3.0)
    assert m.cost_to_target(Knobs(32, 1, 0.5)) == pytest.approx(0.14 * 2.0)
    assert m.best([Knobs(32, 1, r) for r in (1.0, 0.5, 0.125)]) == Knobs(32, 1, 0.125)
    # without a price, pacing is never chosen: it can only slow the job
    free = CostModel(m.p.with_(rate_price=0.0))
    assert free.best([Knobs(32, 1, r) for r in (0.125, 0.5, 1.0)]) == Knobs(32, 1, 0.5) or \
        free.rate(Knobs(32, 1, 0.5)) == free.rate(Knobs(32, 1, 1.0))
    assert free.rate(Knobs(32, 1, 0.125)) > free.rate(Knobs(32, 1, 1.0))


def test_joint_paces_where_decoupled_cannot_see_that_pacing_is_cheap():
    """The thin link's model, the job alone on its 10 Gb/s link, and a priced link share:
    Joint pairs int4 with a = 2, where the exchange is a small part of a step, and paces
    down to half the link; Decoupled's network half prices pacing at a = 1, where the
    exchange is a larger part of the step, and keeps the full link. Joint's choice is the
    brute-force argmin, and cheaper than Decoupled's."""
    sp = KnobSpace(paces=(1.0, 0.5, 0.25))
    m = CostModel(thin_link().p.with_(rate_price=2.0, link_rate=1.25e9, bandwidth=1.25e9))
    joint, dec = Joint(sp).propose(m), Decoupled(sp).propose(m)
    assert joint == min(sp.all(), key=m.rate)
    assert joint.pace < 1.0 and dec.pace == 1.0
    assert m.rate(dec) > 1.1 * m.rate(joint)
    # at lambda = 0 neither paces
    m0 = CostModel(m.p.with_(rate_price=0.0))
    assert Joint(sp).propose(m0).pace == Decoupled(sp).propose(m0).pace == 1.0


def test_a_paced_transfer_in_the_simulator_by_hand():
    """A 10 MB transfer on a link whose share is 100 MB/s, then 25 MB/s from t = 0.05 s;
    capped at 50 MB/s it takes 0.1 s at 50 then 25 MB/s: 2.5 MB by 0.05 s, the rest
    7.5 MB at 25 MB/s, 0.3 s more."""
    from ina_fabric.bench.experiments.contention import BandwidthTrace
    tr = BandwidthTrace([0.0, 0.05], [100e6, 25e6])
    assert tr.transfer_end(0.0, 10e6) == pytest.approx(0.05 + 5e6 / 25e6)
    assert tr.capped(50e6).transfer_end(0.0, 10e6) == pytest.approx(0.05 + 7.5e6 / 25e6)
    with pytest.raises(ConfigError, match="cap"):
        tr.capped(0.0)


def test_simulated_cost_counts_the_price_of_the_pace():
    from ina_fabric.bench.experiments.contention import BandwidthTrace
    from ina_fabric.bench.experiments.simulate import paper_scenario, simulate
    sc = paper_scenario(kappa2=30.0, space=KnobSpace(paces=(1.0, 0.25)), s_min=50.0)
    sc.job = sc.job.with_(bandwidth=1.25e9, rate_price=2.0)
    trace = BandwidthTrace.constant(1.25e9 / 3)
    static = simulate(make_controller("static", sc.space), sc, trace, seed=0)
    assert static.cost == pytest.approx(3.0 * static.time_to_target)   # unpaced: 1 + 2
    joint = simulate(make_controller("joint", sc.space), sc, trace, seed=0)
    assert (joint.log["pace"] < 1.0).any()
    assert joint.time_to_target < joint.cost < 3.0 * joint.time_to_target
