"""`ina schedule` end to end: the JSON the host runtime loads, the PNG, training."""

import json

import numpy as np
import pytest

from ina_fabric.host.cli import main
from ina_fabric.protocol.jobtable import JobConfig, Member
from ina_fabric.bench.experiments.schedule import training_comparison
from ina_fabric.host.schedule.model import NetConfig
from ina_fabric.host.schedule.topology import default_topology
from ina_fabric.host.schedule.train import IslandTrainConfig


def test_optimize_writes_loadable_json_and_png(tmp_path, capsys):
    out, png = tmp_path / "schedule.json", tmp_path / "schedule.png"
    rc = main(["schedule", "optimize", "--memory", "1e8", "--update-bytes", "1e9",
               "--out", str(tmp_path), "--plot"])
    text = capsys.readouterr().out
    assert rc == 0 and "best: cliques-3, 2 rounds" in text
    assert png.stat().st_size > 10_000
    doc = json.loads(out.read_text())
    assert doc["format"] == "ina-schedule/1" and len(doc["rounds"]) == 2
    ids = set()
    for rnd in doc["rounds"]:
        members = [m for g in rnd["groups"] for m in g["members"]]
        assert sorted(members) == sorted(i["name"] for i in doc["islands"])
        for g in rnd["groups"]:
            assert len({s["wan_group"] for s in g["send"]}) == 1     # one group per clique
            assert g["job"] not in ids
            ids.add(g["job"])
            for e in g["edge_jobs"]:
                cfg = JobConfig(e["id"], tuple(e["workers"]), e["window"], e["elements"],
                                mcast=Member.parse(e["multicast"]).addr)
                assert cfg.n == len(g["members"]) - 1
                assert cfg.to_bytes() and JobConfig.from_bytes(cfg.to_bytes()) == cfg
                assert e["buffer_bytes"] <= doc["memory_bytes"]
    assert sum(r["predicted_s"] for r in doc["rounds"]) == pytest.approx(doc["t_cycle_s"])


def test_simulate_command_agrees(capsys):
    rc = main(["schedule", "simulate", "--memory", "20M", "--update-bytes", "100M"])
    out = capsys.readouterr().out
    assert rc == 0 and "within 10%" in out


def test_bad_sizes_are_cli_errors(capsys):
    assert main(["schedule", "optimize", "--memory", "lots"]) == 2
    assert "bad size" in capsys.readouterr().err


def test_training_schedule_beats_wan_allreduce():
    cfg = IslandTrainConfig(rounds=40, local_steps=4, compute_s=0.3, seed=1)
    out = training_comparison(default_topology(), NetConfig(memory_bytes=1e8), cfg, seed=0)
    rows = {r["method"].split(":")[0]: r for r in out["rows"]}
    for tr in out["traces"]:
        assert tr.loss[-1] < 0.5 * tr.loss[0]          # real learning on real data
        assert np.all(np.diff(tr.time) > 0)
    colo = rows["colocated (LAN ring all-reduce)"]
    ring = rows["WAN ring all-reduce"]
    sched = rows["schedule"]
    assert colo["gap_vs_colocated"] == 1.0
    assert ring["gap_vs_colocated"] >= 3.0
    assert sched["gap_vs_colocated"] < ring["gap_vs_colocated"] / 2
    assert sched["gap_vs_colocated"] <= 1.3


def test_sweep_memory_command_shows_the_shift(tmp_path, capsys):
    png, js = tmp_path / "sweep_memory.png", tmp_path / "sweep_memory.json"
    rc = main(["schedule", "sweep-memory", "--memories", "2e6,1e10", "--out", str(tmp_path),
               "--plot"])
    out = capsys.readouterr().out
    assert rc == 0 and png.stat().st_size > 10_000
    rows = json.loads(js.read_text())
    assert [r["best"] for r in rows] == ["cliques-3", "all-to-all"]
    assert [r["best_k"] for r in rows] == [3, 9]
    lines = [ln for ln in out.splitlines() if ln.strip().startswith(("2e+06", "1e+10"))]
    assert "cliques-3" in lines[0] and "all-to-all" in lines[1]
