"""The precision option (issue 40, docs/precision.md): INA_PRECISION for the backend and
the DDP hook, the per-bucket hook a controller sets (``InaHookState.set_precision``),
``ina allreduce --precision`` and ``ina bench precision --loopback`` (tiny, on loopback)."""

import json
import subprocess
import sys
import threading
import types

import numpy as np
import pytest
import torch

from ina_fabric.host.transport import quantize as Q
from ina_fabric.host.transport.precision import Precision


class _OneRank:
    rank, world = 0, 1

    def agree(self, ok):
        return ok


def test_hook_settings_read_ina_precision():
    from ina_fabric.host.ddp.hook import hook_settings
    env = {"INA_SWITCH": "127.0.0.1:19900"}
    assert hook_settings(env).precision == Precision(32)
    assert hook_settings(env, precision=16).precision == Precision(16)
    env["INA_PRECISION"] = "int8:stochastic"
    assert hook_settings(env, precision=16).precision == Precision(8, "stochastic")
    env["INA_PRECISION"] = "int7"
    with pytest.raises(ValueError, match="INA_PRECISION='int7'") as e:
        hook_settings(env)
    assert "\n" not in str(e.value)


def test_backend_options_take_a_precision():
    from ina_fabric.distributed import InaOptions
    assert InaOptions(precision="int16").precision == "int16"


@pytest.fixture
def one_worker_switch():
    """A compiled switch holding a one-worker job, and a client of it."""
    from ina_fabric.host.switch import SwitchServer
    from ina_fabric.host.transport import SwitchClient
    from ina_fabric.host.cluster import free_udp_ports
    from ina_fabric.protocol.jobtable import JobConfig
    port, = free_udp_ports(1)
    job = JobConfig(1, (f"127.0.0.1:{port}",), window=8, elements=256)
    server = SwitchServer([job], "127.0.0.1", 0, key=None)
    t = threading.Thread(target=server.serve_forever, args=(False,), daemon=True)
    t.start()
    client = SwitchClient(server.address, 1, 0, 1, 8, 256, bind=("127.0.0.1", port),
                          session=job.session)
    yield server, client
    client.close()
    server.stop()
    t.join(2)
    server.close()


def test_a_controller_sets_the_precision_per_bucket(one_worker_switch):
    """``set_precision(fn)``: fn(bucket) -> width for every DDP bucket, called on the
    training thread; each bucket goes at its width (the switch sees DATA of each width;
    the hook counts the bytes by width) and within its bound."""
    from ina_fabric.host.ddp.hook import InaHookState, ina_hook
    server, client = one_worker_switch
    state = InaHookState(client, peers=_OneRank(), average=False)
    asked = []

    def per_bucket(bucket):
        asked.append(bucket.index())
        return {0: 8, 1: 16}.get(bucket.index())         # bucket 2: the client's (int32)

    state.set_precision(per_bucket)
    rng = np.random.default_rng(3)
    data = [rng.standard_normal(1000).astype(np.float32) for _ in range(3)]
    for i, x in enumerate(data):
        bucket = types.SimpleNamespace(buffer=lambda x=x: torch.from_numpy(x.copy()),
                                       index=lambda i=i: i)
        y = ina_hook(state, bucket).wait().numpy()
        bits = {0: 8, 1: 16}.get(i, 32)
        bound = Q.error_bounds([x], 256, bits) + np.abs(x) * 2.0 ** -23
        assert (np.abs(y - x) <= bound).all(), bits
        if bits < 32:
            assert not np.array_equal(y, x)                  # really quantized narrower
    assert asked == [0, 1, 2]
    assert state.bytes_by_width == {8: 1000, 16: 2000, 32: 4000}
    state.set_precision("int16")
    assert state.precision_for() == Precision(16)
    with pytest.raises(ValueError, match="precision"):
        state.set_precision(12)
    state.close(remove=False)


def test_ina_allreduce_precision_checks_its_bound():
    r = subprocess.run([sys.executable, "-m", "ina_fabric", "allreduce", "--workers", "2",
                        "--size", "64K", "--iterations", "1", "--precision", "8"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "int8" in r.stdout and "(must be <= 1)" in r.stdout
    r = subprocess.run([sys.executable, "-m", "ina_fabric", "allreduce", "--precision",
                        "int4"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "--precision" in r.stderr


def test_bench_precision_loopback_writes_checked_rows(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ina_fabric", "bench", "--out", str(tmp_path),
                        "precision", "--loopback", "--hosts", "2", "--size", "256K",
                        "--reps", "3", "--elements", "512"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "precision.json").read_text())
    rows = doc["figures"]["rows"]
    assert [row["width"] for row in rows] == [32, 16, 8]
    for row in rows:
        for k in ("width", "hosts", "rate_mbit", "time_s", "speedup_vs_int32",
                  "max_error_over_bound", "checked"):
            assert k in row, k
        assert row["checked"] and row["max_error_over_bound"] <= 1.0
        assert len(row["times_s"]) == 3 and row["hosts"] == 2
        assert row["time_s_stats"]["min"] <= row["time_s"] <= row["time_s_stats"]["max"]
    r = subprocess.run([sys.executable, "-m", "ina_fabric", "bench", "precision",
                        "--reps", "0", "--loopback"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "--reps" in r.stderr
