"""The DDP comm hook in real multi-process training: parity with Gloo within the stated
bound, identical replicas under loss, fallback to Gloo, and clear address errors."""

import subprocess
import sys

import numpy as np
import pytest

from ina_fabric.host.transport import quantize as Q
from ina_fabric.host.ddp.train import TrainConfig, run_training

pytestmark = pytest.mark.xdist_group("torch")


def test_parity_with_gloo_within_quantization_bound():
    """Plain SGD, K steps from the same seed. Per step and element, the averaged
    gradient differs from Gloo's by at most G*(2**-S + N*2**-24) (fixed-point rounding of
    N contributions, plus float32 rounding of the two sums), G the largest local
    |gradient|; over K steps of SGD with rate lr, parameters differ by at most
    K*lr*G*(2**-S + N*2**-24), while lr*L*K << 1 (L the gradient's Lipschitz constant)."""
    K, N = 5, 4
    cfg = dict(max_steps=K, momentum=0.0, stop_at_target=False, workers=N)
    ina = run_training(TrainConfig(backend="ina", **cfg), keep_params=True)
    gloo = run_training(TrainConfig(backend="gloo", **cfg), keep_params=True)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(ina.params, gloo.params))
    lr = 0.05
    bound = K * lr * ina.max_abs_grad * (2.0 ** -Q.scale_bits(N) + N * 2.0 ** -24)
    assert ina.max_abs_grad > 0 and ina.stats["calls"] >= K
    assert diff <= bound, (diff, bound)


@pytest.mark.parametrize("backend", ["ina", "ina-bounded"])
def test_replicas_bitwise_identical_under_loss(backend):
    res = run_training(TrainConfig(backend=backend, max_steps=40, stop_at_target=False,
                                   loss=0.02, deadline_ms=20.0, elements=1024))
    assert len(res.param_hashes) == 4 and len(set(res.param_hashes)) == 1
    if backend == "ina":   # losses were recovered by retransmission
        assert res.stats["retransmits"] > 0 and res.stats["entries_lost"] == 0
    else:                  # losses became partial slots, applied identically everywhere
        assert res.stats["partial_slots"] > 0 and res.stats["entries_lost"] > 0


def test_falls_back_to_gloo_when_no_switch_answers(ports):
    dead, = ports(1)
    res = run_training(TrainConfig(backend="ina", switch=f"127.0.0.1:{dead}",
                                   max_steps=5, stop_at_target=False))
    assert res.fallbacks == 4 and res.steps == 5
    assert len(set(res.param_hashes)) == 1 and res.stats.get("packets_sent", 0) == 0


def test_bad_switch_address_is_a_clear_error():
    with pytest.raises(ValueError, match="bad switch address"):
        TrainConfig(switch="not-an-address").validate()
    out = subprocess.run([sys.executable, "-m", "ina_fabric.host.cli", "train", "--switch", "nonsense"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "bad address 'nonsense': expected ip:port" in out.stderr
    from ina_fabric.host.ddp.hook import switch_from_env
    with pytest.raises(ValueError, match="bad switch address"):
        switch_from_env("10.0.0.1:notaport")
    with pytest.raises(ValueError, match="INA_SWITCH"):
        switch_from_env(None)


def test_static_job_on_a_switch_loaded_beforehand(ports):
    """As with an FPGA: the job table is loaded before training (here `ina switch
    --workers`), workers bind the ports it names, and nothing is sent by CONTROL."""
    import time
    from conftest import consecutive_free_ports
    from ina_fabric.host.switch import query_status
    sport, = ports(1)
    base = consecutive_free_ports(2)
    proc = subprocess.Popen([sys.executable, "-m", "ina_fabric.host.cli", "switch", "--listen",
                             f"127.0.0.1:{sport}", "--local-workers", "2", "--base-port",
                             str(base), "--elements", "256", "--session", "0x5e551"],
                            stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                query_status(("127.0.0.1", sport), timeout=0.1)
                break
            except OSError:
                time.sleep(0.1)
        res = run_training(TrainConfig(backend="ina", workers=2, switch=f"127.0.0.1:{sport}",
                                       static_job=True, worker_base_port=base,
                                       session=0x5E551,
                                       elements=256, max_steps=3, stop_at_target=False))
        counters = query_status(("127.0.0.1", sport))["counters"]
    finally:
        proc.terminate()
        proc.wait()
    assert res.fallbacks == 0 and res.stats["packets_sent"] > 0
    assert counters.get("control", 0) == 0 and counters["results"] > 0
