"""The controller on real links (issue 23): the fitted progress model, the statistics,
the background jobs' ring all-reduce and schedule, the learning-rate rule, the charlm
workload and the loss target of the training loop."""

import json
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from ina_fabric.bench.experiments.labexp import ratio_ci
from ina_fabric.bench.experiments.labrun import LAB_LEVELS, schedule_for
from ina_fabric.bench.experiments.progress import (ProgressModel, fit, predict_steps,
                                              steps_at_losses)
from ina_fabric.host.lab.bgjob import _ring_allreduce, intervals_for


def _known_model():
    return ProgressModel(np.array([2.7, 2.5, 2.4, 2.3, 2.2, 2.1]),
                         np.array([20.0, 15.0, 20.0, 30.0, 40.0]),
                         np.array([10.0, 30.0, 60.0, 100.0, 150.0]), 4, 8, {4: 0.1})


def _curve(m, q, a, target):
    curve, u, s = [(0, 2.9)], 0.0, 0
    while u < m.total(target) + 1:
        u += m.step_progress(u, q, a)
        s += 1
        curve.append((s, m.loss_at(u)))
    return curve


def test_fit_recovers_a_known_progress_model():
    m = _known_model()
    runs = [(32, a, _curve(m, 32, a, 2.1)) for a in (1, 4, 16)]
    f = fit(runs, m.losses, 4, 8, {4: 0.1})
    np.testing.assert_allclose(f.du, m.du, rtol=0.06)
    np.testing.assert_allclose(f.b_noise, m.b_noise, rtol=0.06)
    # held out: a precision and a batch the fit never saw, and a knob change mid-run
    for marks in ([(0, 4, 4)], [(0, 32, 2)], [(0, 32, 1), (100, 4, 8)]):
        exact = predict_steps(m, marks, 2.1)[1]
        assert abs(predict_steps(f, marks, 2.1)[1] / exact - 1) < 0.03


def test_fit_needs_two_batch_sizes_and_ignores_quantized_runs():
    m = _known_model()
    with pytest.raises(ValueError, match="two or more batch sizes"):
        fit([(32, 1, _curve(m, 32, 1, 2.1)), (4, 4, _curve(m, 4, 4, 2.1))], m.losses, 4, 8)


def test_quantization_and_batch_cost_progress_in_the_model():
    m = _known_model()
    s32, _ = predict_steps(m, [(0, 32, 1)], 2.1)
    s4, _ = predict_steps(m, [(0, 4, 1)], 2.1)
    _, e1 = predict_steps(m, [(0, 32, 1)], 2.1)
    _, e16 = predict_steps(m, [(0, 32, 16)], 2.1)
    assert s4 > s32                 # int4 adds noise: more steps
    assert e16 > 2 * e1             # B = 512 is far above B_noise: samples wasted


def test_steps_at_losses_interpolates_the_running_minimum():
    curve = [(0, 3.0), (10, 2.5), (20, 2.6), (30, 2.0)]
    s = steps_at_losses(curve, [3.0, 2.75, 2.5, 2.25, 1.0])
    assert s[0] == 0 and s[1] == pytest.approx(5) and s[2] == pytest.approx(10)
    assert s[3] == pytest.approx(25)       # 2.5 held from 10 to 20, then down to 2.0 at 30
    assert np.isnan(s[4])


def test_ratio_ci():
    m, lo, hi = ratio_ci([1.2, 1.2, 1.2])
    assert m == pytest.approx(1.2) and lo == pytest.approx(1.2) and hi == pytest.approx(1.2)
    m, lo, hi = ratio_ci([1.15, 1.25, 1.2])
    assert lo < m < hi and lo > 1.0
    m, lo, hi = ratio_ci([0.9, 1.3, 1.1])
    assert lo < 1.0 < hi                   # inside the noise


def test_schedules_and_job_intervals():
    s = schedule_for("heavy", 1, 10.0, 45.0)
    assert s == [(0.0, 3), (10.0, 4), (20.0, 2), (30.0, 4), (40.0, 3)]
    assert [n for _, n in schedule_for("light", 0, 10.0, 40.0)] == LAB_LEVELS["light"]
    # job j is present while more than j jobs run; adjacent intervals merge
    assert intervals_for(s, 0, 45.0) == [(0.0, 45.0)]
    assert intervals_for(s, 2, 45.0) == [(0.0, 20.0), (30.0, 45.0)]
    assert intervals_for(s, 3, 45.0) == [(10.0, 20.0), (30.0, 40.0)]
    assert intervals_for(s, 4, 45.0) == []


def test_ring_allreduce_sums_over_real_sockets():
    world, n = 3, 10_001
    pairs = [socket.socketpair() for _ in range(world)]     # pairs[r]: r -> r+1
    rng = np.random.default_rng(0)
    data = [rng.standard_normal(n).astype(np.float32) for _ in range(world)]
    expect = np.sum(data, axis=0)
    sent = [0] * world

    def rank(r):
        nxt, prv = pairs[r][0], pairs[(r - 1) % world][1]
        sent[r] = _ring_allreduce(data[r], r, world, nxt, prv)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for r in range(world):
        np.testing.assert_allclose(data[r], expect, rtol=1e-5, atol=1e-5)
    # 2(N-1)/N of the gradient leaves every rank
    assert sum(sent) == pytest.approx(2 * (world - 1) * n * 4, rel=1e-3)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_background_job_runs_only_while_present():
    """Two ranks on loopback: present from 0 to 0.6 s of a schedule that starts 4 s from
    now (after their start-up); they agree on every step (the same count), stop by
    themselves when the job leaves for good, and report what they sent."""
    ports = [_free_port(), _free_port()]
    epoch = time.monotonic() + 4.0
    procs = [subprocess.Popen(
        [sys.executable, "-m", "ina_fabric.host.lab.bgjob", "--rank", str(r), "--world", "2",
         "--port", str(ports[r]), "--next", f"127.0.0.1:{ports[1 - r]}", "--bytes", "40000",
         "--compute", "0.05", "--active", "0:0.6", "--epoch", str(epoch), "--seconds", "20"],
        stdout=subprocess.PIPE, text=True) for r in range(2)]
    outs = [json.loads(p.communicate(timeout=30)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert time.monotonic() - epoch < 12
    assert outs[0]["steps"] == outs[1]["steps"]
    assert 2 <= outs[0]["steps"] <= 14        # about 0.6 s / 0.05 s, on a loaded machine
    assert outs[0]["bytes"] == outs[0]["steps"] * 40000     # 2(N-1)/N of 40 KB, N = 2


def test_lr_scaling_rule_and_validation():
    from ina_fabric.host.ddp.train import TrainConfig, scaled_lr
    assert scaled_lr(2e-3, 4, "sqrt") == pytest.approx(4e-3)
    assert scaled_lr(0.1, 4, "linear") == pytest.approx(0.4)
    assert scaled_lr(0.1, 8, "none") == 0.1
    with pytest.raises(ValueError, match="lr_scaling"):
        TrainConfig(lr_scaling="cube").validate()


def test_charlm_workload():
    import torch
    from ina_fabric.host.ddp.workloads import CHARLM_VOCAB, charlm_encode, get_workload
    assert charlm_encode("\tA\n~\ré").tolist() == [0, 35, 1, 96, CHARLM_VOCAB - 1, 33]
    wl = get_workload("charlm", 0)
    assert wl.x_train.shape[1] == 64 and wl.x_test.shape == (256, 64)
    assert torch.equal(wl.x_train[0, 1:], wl.y_train[0, :-1])     # next character
    out = wl.model(wl.x_test[:4])
    assert out.shape == (4, CHARLM_VOCAB, 64)
    loss = torch.nn.functional.cross_entropy(out, wl.y_test[:4])
    assert abs(loss.item() - np.log(CHARLM_VOCAB)) < 0.7           # untrained: near uniform
    # causal: changing a later character does not change earlier predictions
    x = wl.x_test[:1].clone()
    y0 = wl.model(x)
    x[0, 40] = (x[0, 40] + 1) % CHARLM_VOCAB
    y1 = wl.model(x)
    assert torch.allclose(y0[..., :40], y1[..., :40], atol=1e-5)
    assert not torch.allclose(y0[..., 40:], y1[..., 40:], atol=1e-5)


@pytest.mark.xdist_group("training")
def test_training_stops_at_a_target_loss_with_scaled_lr():
    """Real DDP training (2 workers, Gloo) to a test loss: the loss events are recorded,
    the run stops when the target is reached, samples count a * b * N per step."""
    from ina_fabric.host.ddp.train import TrainConfig, run_training
    cfg = TrainConfig(workload="charlm", workers=2, backend="gloo", target_loss=3.2,
                      accum_steps=2, lr_scaling="sqrt", eval_every_samples=64,
                      max_epochs=1, max_steps=60)
    r = run_training(cfg, timeout=300)
    assert r.time_to_loss is not None and r.loss_curve[-1][3] <= 3.2
    assert all(c[3] > 3.2 for c in r.loss_curve[:-1])
    assert r.samples_to_loss == r.steps * 2 * 8 * 2
    assert r.steps < 60 and len(set(r.param_hashes)) == 1


def test_crossing_interpolates_between_evaluations():
    from ina_fabric.bench.experiments.labexp import crossing
    # (training seconds, step, samples, test loss) every 1024 samples
    curve = [(10.0, 32, 1024, 2.6), (20.0, 64, 2048, 2.2), (30.0, 96, 3072, 2.0)]
    assert crossing(curve, 2.4, 0) == pytest.approx(15.0)
    assert crossing(curve, 2.1, 2) == pytest.approx(2560)
    assert crossing(curve, 1.9, 0) is None


@pytest.mark.parametrize("argv, msg", [
    (["--lab", "--lab-levels", "bogus"], "--lab-levels"),
    (["--lab", "--lab-seeds", "1"], "--lab-seeds"),
    (["--lab-analyze", "/nonexistent/raw.json"], "--lab-analyze"),
])
def test_bench_control_lab_rejects_bad_flags(argv, msg, capsys):
    from ina_fabric.bench.bench_control import main
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]


def test_analysis_of_recorded_runs(tmp_path):
    """``analyze`` (what --lab-analyze runs) on recorded runs made from a known model:
    the fit check is exact, the paired ratios and their interval are the recorded ones,
    and the plot is written."""
    from ina_fabric.bench.experiments.labexp import FIT_KNOBS, GRID, analyze
    from ina_fabric.bench.experiments.labrun import LabSetup
    m = ProgressModel(np.array(GRID), np.array([7.0, 5.0, 5.0, 14.0, 22.0, 11.0]),
                      np.array([70.0, 60.0, 80.0, 50.0, 70.0, 290.0]), 4, 8, {4: 0.1})

    def loss_curve(q, a, seconds_per_step):
        c = _curve(m, q, a, 2.1)[1:]
        return [(s * seconds_per_step, s, s * a * 32, loss) for s, loss in c]

    fit_runs = [{"precision": q, "accum": a, "r_q": {"4": 0.1}, "samples": None,
                 "curve": [(0, GRID[0])] + [(s, loss) for s, loss in _curve(m, q, a, 2.1)[1:]]}
                for q, a in FIT_KNOBS]
    log = [{"time": 1.0, "latency": 0.2, "t_compute": 0.05, "precision": 4, "accum": 2}] * 3
    lab_runs = []
    for seed in (0, 1, 2):
        for name, a, sps in (("joint", 2, 0.5), ("decoupled", 4, 0.6 + 0.1 * seed)):
            lc = loss_curve(4, a, sps)
            lab_runs.append({"level": "heavy", "seed": seed, "controller": name,
                             "loss_curve": lc, "knobs": [(0.0, 0, a, 4)], "steps": lc[-1][1],
                             "schedule": [(0.0, 4), (10.0, 2)], "log": log})
    raw = {"fit_runs": fit_runs, "lab_runs": lab_runs, "target_loss": 2.1,
           "levels": ["heavy"], "seeds": [0, 1, 2], "setup": {}}
    fig = analyze(raw, LabSetup(), plot=tmp_path / "p.png", out=lambda *a: None)
    assert all(abs(c["rel_error"]) < 0.03 for c in fig["fit_check"] if c["kind"] == "lab")
    h = fig["levels"]["heavy"]
    assert h["seeds"] == 3 and h["ci95_low"] < h["decoupled_over_joint"] < h["ci95_high"]
    r = h["per_seed_ratio"]
    assert h["decoupled_over_joint"] == pytest.approx(np.exp(np.mean(np.log(r))))
    assert r[0] < r[1] < r[2]           # Decoupled's steps were made slower seed by seed
    # same samples per step in both runs of a seed: the ratio is that of step counts x time
    assert r[0] == pytest.approx(h["runs"][0]["decoupled_s"] / h["runs"][0]["joint_s"])
    assert h["sim_decoupled_over_joint"] > 0
    # each seed's simulated runs beside the measured ones, consistent with the ratio
    for ps, sim in zip(h["runs"], h["sim_per_seed"]):
        assert ps["sim_decoupled_s"] / ps["sim_joint_s"] == pytest.approx(sim)
        assert ps["sim_joint_steps"] > 0
        assert sum(ps["sim_joint_knobs"].values()) == pytest.approx(1.0, abs=0.01)
    assert (tmp_path / "p.png").stat().st_size > 10_000
