"""The training loop itself."""

import pytest

from ina_fabric.host.ddp.train import TrainConfig, run_training

pytestmark = pytest.mark.xdist_group("torch")


def test_accumulation_longer_than_an_epoch_still_steps():
    # digits on 4 workers has 11 micro-batches per epoch; 16 must span two epochs
    res = run_training(TrainConfig(backend="gloo", accum_steps=16, max_steps=2,
                                   max_epochs=10, stop_at_target=False))
    assert res.steps == 2


def test_bad_config_is_rejected():
    for bad, msg in [(dict(workers=0), "workers"), (dict(accum_steps=0), "accum_steps"),
                     (dict(backend="carrier-pigeon"), "backend"),
                     (dict(workload="imagenet"), "unknown workload")]:
        with pytest.raises(ValueError, match=msg):
            TrainConfig(**bad).validate()


def test_a_failing_rank_reports_its_own_error_quickly():
    """The parent shows the failing rank's own exception (it said only "worker exited
    with status 1"), and does not wait out serial 10 s joins of the other ranks."""
    import time
    t = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank \d: ModuleNotFoundError: .*no_such_mod"):
        run_training(TrainConfig(backend="no_such_mod_xyz:factory", workers=2, max_steps=1))
    assert time.monotonic() - t < 25


def test_digits_mlp_is_a_wide_model_that_reaches_its_target():
    """The communication-bound workload: 1.1M parameters (4.5 MB of gradients) on the
    digits, its target from the one table, and it reaches it on two ranks."""
    from ina_fabric.host.ddp.workloads import TARGETS, get_workload
    wl = get_workload("digits-mlp", 0)
    assert sum(p.numel() for p in wl.model.parameters()) == 1_126_410
    assert wl.target == TARGETS["digits-mlp"] == 0.95
    assert wl.x_train.shape[1:] == (64,) and len(wl.x_test) == 360
    res = run_training(TrainConfig(backend="gloo", workload="digits-mlp", workers=2,
                                   max_epochs=12))
    assert res.time_to_accuracy is not None and res.final_accuracy >= 0.95
