"""``ina bench fabric``'s summary, without the lab (its measurement replaced by given
figures): fabric.json gets a row per shape with the issue's fields and the saturation
evidence (each mode's time over the links' own time, the CPU's busy share, the rows that
were CPU-bound). The summary once ended in a NameError after the whole bench had run."""

import json

import pytest

from ina_fabric.bench import bench_fabric as F


def _fake_measure(busy):
    def measure(a, racks, per_rack, modes):
        hosts = racks * per_rack
        wire = F.wire_seconds(F.SIZES[a.size], a.elements, per_rack, 50e6, 50e6, hosts)
        stretch = {"tree": 1.05 if racks == 1 else 1.4, "flat": 1.02, "gloo": 1.01}
        return {"times": {m: [wire[m] * stretch[m]] * 3 for m in modes},
                "worst_error_over_bound": 0.2, "identical": True,
                "cpu_busy": {m: busy[racks] for m in modes},
                "cpu_lab": {m: 0.3 for m in modes},
                "stats": {m: {"retransmits": 0} for m in modes if m != "gloo"},
                "pace": {"flat": 0, "tree": 0}, "oversubscription": float(per_rack),
                "uplink_rate": 50e6, "straggler_host": "r0h1"}
    return measure


def test_fabric_json_states_what_saturated(tmp_path, monkeypatch, capsys):
    import ina_fabric.bench._results as R
    import ina_fabric.host.lab as lab
    monkeypatch.setattr(R, "RESULTS", tmp_path)
    monkeypatch.setattr(lab, "available", lambda: None)
    monkeypatch.setattr(F, "measure", _fake_measure({1: 0.5, 4: 0.97}))
    assert F.main(["--rate", "50mbit", "--shapes", "1x4,4x4", "--reps", "3"]) == 0
    doc = json.loads((tmp_path / "fabric.json").read_text())["figures"]
    one, four = doc["rows"]
    for k in ("hosts", "racks", "oversubscription", "rate_mbit", "tree_s", "flat_s",
              "gloo_s", "gloo_over_tree", "flat_over_tree", "tree_over_one_rack", "checked"):
        assert k in four, k
    assert four["rate_mbit"] == 50 and four["checked"]
    assert four["tree_over_one_rack"] == pytest.approx(1.4 / 1.05)
    s = four["saturation"]
    assert s["over_wire"]["tree"] == pytest.approx(1.4) and s["cpu_busy_max"] == 0.97
    assert s["cpu_bound"] == ["tree"] and one["saturation"]["cpu_bound"] == []
    assert doc["cpu_saturated"] and doc["cpu_bound_rows"] == ["4x4"]
    assert "CPU-bound (over 10% above the wire time): 4x4 (tree)" in capsys.readouterr().out


def test_wire_time_by_hand():
    """64 MiB at 100 Mbit/s, 8,192 elements a packet: 2,048 packets of 32,768 bytes plus
    the INA header and 66 bytes of framing; flat sends 4 copies over the uplink; Gloo's
    ring 2(N-1)/N of the buffer."""
    from ina_fabric.protocol.fields import HEADER_BYTES
    w = F.wire_seconds(64 << 20, 8192, 4, 100e6, 100e6, 16)
    on_wire = (64 << 20) + 2048 * (HEADER_BYTES + 66)
    assert w["tree"] == pytest.approx(on_wire * 8 / 100e6)
    assert w["flat"] == pytest.approx(4 * w["tree"])
    assert w["gloo"] == pytest.approx(2 * 15 / 16 * (64 << 20) * 8 / 100e6)


def test_a_failed_straggler_phase_keeps_the_figures_and_fails_the_bench(tmp_path, monkeypatch,
                                                                        capsys):
    """A straggler phase that raised on the ranks (once: a CPU-starved rack fell more than
    the job window behind and every rank of the bench died, taking the measured 4x4 row with
    it) is a row's ``failed`` entry with the error, the other figures written, exit 1."""
    import ina_fabric.host.lab as lab
    import ina_fabric.bench._results as R
    monkeypatch.setattr(R, "RESULTS", tmp_path)
    monkeypatch.setattr(lab, "available", lambda: None)
    fake = _fake_measure({1: 0.5, 4: 0.5})

    def measure(a, racks, per_rack, modes):
        res = fake(a, racks, per_rack, modes)
        ok = {"base_s": [0.1, 0.11], "straggler_s": [0.11, 0.12], "identical": True,
              "failed": None, "partial_slots": 3, "partial_slots_base": 0,
              "partial_slots_straggler": 3, "abandoned_slots": 0}
        res["straggler"] = {"tree": ok if racks == 1 else
                            {**ok, "straggler_s": [0.2], "failed": ["5: AllreduceTooLate: x"]}}
        return res
    monkeypatch.setattr(F, "measure", measure)
    assert F.main(["--shapes", "1x4,4x4", "--straggler-ms", "30"]) == 1
    one, four = json.loads((tmp_path / "fabric.json").read_text())["figures"]["rows"]
    assert one["straggler"]["tree"]["cost_p50_deadlines"] == pytest.approx(1.0)
    assert four["straggler"]["tree"] == {"failed": ["5: AllreduceTooLate: x"], "calls_done": 1}
    assert four["checked"] and four["tree_s"] is not None
    out = capsys.readouterr().out
    assert "FAILED after 1 calls with the straggler: 5: AllreduceTooLate" in out
    assert "the straggler phase failed: 4x4 tree" in out


def test_a_starved_lab_is_cpu_bound_even_on_a_machine_not_90_percent_busy():
    """The lab runs niced; the machine's busy share alone missed that its threads waited
    for a CPU: a mode over its wire time whose lab threads waited more than
    LAB_WAIT_STARVED of their runnable time is CPU-bound."""
    row = {"tree_s": 1.3, "gloo_s": 1.3}
    wire = {"tree": 1.0, "gloo": 1.0}
    s = F.saturation(row, wire, {"tree": 0.6, "gloo": 0.6}, {"tree": 0.35, "gloo": 0.05})
    assert s["cpu_bound"] == ["tree"] and s["cpu_lab_wait_max"] == 0.35
    assert F.saturation(row, wire, {"tree": 0.6, "gloo": 0.6})["cpu_bound"] == []


def test_cpu_seconds_reads_the_schedulers_account_of_a_process():
    import os
    import time
    m0, own0, ran0, wait0 = F._cpu_seconds([os.getpid()])
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    m1, own1, ran1, wait1 = F._cpu_seconds([os.getpid()])
    assert ran1 - ran0 >= 0.15 and own1 - own0 >= 0.1 and m1 - m0 >= 0.1
    assert wait1 >= wait0 >= 0


def test_one_racks_wire_time_leaves_out_the_uplink():
    """One rack of 2 at 4:1 has a 50 Mbit uplink that its tree and Gloo never cross (the
    quick bench's 1x2 once read 0.50 of its wire time): their wire time is the host
    link's; flat's switch is at the spine, so flat's still crosses the uplink."""
    one = F.wire_seconds(4 << 20, 2048, 2, 100e6, 50e6, 2, racks=1)
    two = F.wire_seconds(4 << 20, 2048, 2, 100e6, 50e6, 4, racks=2)
    assert one["tree"] == pytest.approx(two["tree"] / 2)
    assert one["gloo"] == pytest.approx(2 * 1 / 2 * (4 << 20) * 8 / 100e6)
    assert one["flat"] == pytest.approx(two["flat"])
