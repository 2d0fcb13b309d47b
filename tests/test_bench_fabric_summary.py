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
