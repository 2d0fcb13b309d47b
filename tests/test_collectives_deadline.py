"""Deadline policy: calibration at P95, shrinks when quiet, grows under delay."""

import numpy as np
import pytest

from ina_fabric.host.deadline import DeadlinePolicy, SwitchDeadline


def calibrated(samples, **kw):
    p = DeadlinePolicy(calibration=len(samples), warmup=0, **kw)
    for s in samples:
        assert p.calibrating
        with pytest.raises(RuntimeError):
            p.deadline()
        p.observe(s)
    assert not p.calibrating
    return p


def test_first_deadline_is_p95_of_calibration():
    s = list(np.random.default_rng(0).lognormal(np.log(0.01), 0.3, 20))
    p = calibrated(s)
    assert p.deadline() == pytest.approx(np.percentile(s, 95))


def test_shrinks_when_quiet():
    p = calibrated([0.010, 0.012, 0.011, 0.030, 0.010])
    d0 = p.deadline()
    for _ in range(60):
        p.observe(0.004)            # the network got quiet: rounds complete early
    assert p.deadline() < 0.5 * d0
    assert p.deadline() >= p.min_deadline
    assert p.early_timeout() == pytest.approx(p.early_fraction * p.expected())


def test_grows_under_delay():
    p = calibrated([0.010] * 4 + [0.012])
    d0 = p.deadline()
    for _ in range(10):             # rounds end at the deadline and lose 5%
        p.observe(p.deadline(), lost_fraction=0.05, timed_out=True)
    assert p.deadline() > 5 * d0
    d1 = p.deadline()
    for _ in range(10):             # slow but complete rounds keep it large
        p.observe(0.05)
    assert p.deadline() > 0.03
    assert p.deadline() <= p.max_deadline and d1 <= p.max_deadline


def test_timed_out_but_under_target_loss_does_not_inflate():
    p = calibrated([0.01] * 5)
    d0 = p.deadline()
    for _ in range(20):
        p.observe(d0, lost_fraction=0.001, timed_out=True)
    assert p.deadline() < 1.5 * d0


def test_fixed_and_bad_config():
    p = DeadlinePolicy(fixed=0.02)
    assert not p.calibrating and p.deadline() == 0.02
    p.observe(1.0, 0.5, True)
    assert p.deadline() == 0.02 and len(p.history) == 1
    with pytest.raises(ValueError):
        DeadlinePolicy(calibration=0)
    with pytest.raises(ValueError):
        DeadlinePolicy(early_fraction=0)


def test_switch_deadline_is_per_slot():
    sd = SwitchDeadline(DeadlinePolicy(calibration=2, warmup=0))
    for _ in range(2):
        sd.observe_call(0.2, packets=264, window=64)     # one slot ~ 0.2 * 64 / 264
    assert not sd.calibrating
    assert sd.deadline() == pytest.approx(0.2 * 64 / 264)


def test_warmup_round_is_not_sampled():
    p = DeadlinePolicy(calibration=3)          # warmup=1 by default
    for s in [5.0, 0.01, 0.01, 0.01]:           # a slow first call (connection setup)
        assert p.calibrating
        p.observe(s)
    assert not p.calibrating and p.deadline() == pytest.approx(0.01)
