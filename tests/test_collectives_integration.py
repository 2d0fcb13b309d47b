"""The other collectives behind the same interface: in-network (switch) with the adaptive
deadline policy driving the switch's slot deadline, and TAR inside real DDP training."""

import json
import os

import numpy as np
import pytest

from ina_fabric.host.collectives import make_collective, SwitchTarget
from ina_fabric.host.collectives.adapters import LiveSwitch
from ina_fabric.host.cluster import run_ranks

pytestmark = pytest.mark.xdist_group("tar")
torch = pytest.importorskip("torch")   # imported once here: forked ranks inherit it


def _switch_rank(rank, world, store, sw, mode):
    from ina_fabric.host.switch import query_status
    c = make_collective(f"switch-{mode}", rank, world, store,
                        switch=SwitchTarget(sw[0], sw[1], job=5, window=8),
                        calibration=3, elements=256)
    rows = []
    for i in range(6):
        x = np.random.default_rng([rank, i]).standard_normal(3000).astype(np.float32)
        y, st = c.allreduce(x)
        rows.append((x, y, st["calibrating"], st.get("switch_deadline"), st["entries_lost"]))
    deadline_ms = query_status(tuple(sw[0]))["jobs"] if rank == 0 else None
    c.close()
    return rows, deadline_ms, c.client.mode


@pytest.mark.parametrize("mode", ["reliable", "bounded"])
def test_switch_collective_and_live_deadline(mode):
    with LiveSwitch() as sw:
        res = run_ranks(3, _switch_rank, (sw.address, sw.control), mode)
    for i in range(6):
        total = sum(r[0][i][0].astype(np.float64) for r in res)
        for rows, _, _ in res:
            x, y, calib, dl, lost = rows[i]
            if lost == 0:
                assert np.allclose(y, total, atol=1e-5 * np.abs(total).max() + 1e-6)
    rows0, jobs, client_mode = res[0]
    assert client_mode == mode
    if mode == "bounded":
        assert [r[2] for r in rows0] == [True] * 4 + [False] * 2   # warmup + 3
        job = jobs[0] if isinstance(jobs, list) else jobs.get("5", jobs)
        text = json.dumps(job)
        assert "bounded" in text                    # the switch was switched live
        # the switch's deadline is the policy's (per slot), set from rank 0
        assert rows0[-1][3] is not None and 0 < rows0[-1][3] < 5.0


def test_tar_inside_ddp_training(tmp_path):
    from ina_fabric.host.ddp.train import TrainConfig, run_training
    os.environ["INA_TAR_LOG"] = str(tmp_path)
    try:
        res = run_training(TrainConfig(workload="digits", workers=2, max_steps=6,
                                       backend="ina_fabric.host.collectives.plugin:tar_tcp",
                                       stop_at_target=False))
    finally:
        os.environ.pop("INA_TAR_LOG")
    assert res.steps == 6
    assert len(set(res.param_hashes)) == 1           # exact and reliable: identical
    recs = json.loads((tmp_path / "rank0.json").read_text())["records"]
    assert len(recs) >= 6 and all(r["entries_lost"] == 0 for r in recs)


def _gloo(rank, world, store):
    import torch.distributed as dist
    from ina_fabric.host.collectives import make_collective
    dist.init_process_group("gloo", init_method=f"file://{store.path}/gloo", rank=rank,
                            world_size=world)
    c = make_collective("gloo", rank, world)
    x = np.arange(1001, dtype=np.float32).reshape(7, 143) * (rank + 1)
    y, st = c.allreduce(x)
    dist.destroy_process_group()
    return y, st["entries"], st["entries_lost"], c.name


def test_gloo_behind_the_same_interface():
    res = run_ranks(2, _gloo)
    for y, n, lost, name in res:
        assert name == "gloo" and n == 1001 and lost == 0
        assert np.array_equal(y, np.arange(1001, dtype=np.float32).reshape(7, 143) * 3)
