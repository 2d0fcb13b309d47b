"""Topology files: loading, and bad files rejected with a clear message."""

import json

import pytest

from ina_fabric.host.cli import main
from ina_fabric.host.schedule.topology import load_topology, WanTopologyError, DEFAULT_TOPOLOGY_PATH


def _write(tmp_path, text, name="t.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


GOOD = """
bandwidth_gbps = 40
[[island]]
name = "Tokyo"
[[island]]
name = "Lab"
lat = 48.1
lon = 11.6
bandwidth_gbps = 10
"""


def test_good_toml_and_equivalent_json(tmp_path):
    t = load_topology(_write(tmp_path, GOOD))
    assert t.names == ["Tokyo", "Lab"] and t.bandwidth[1] == 10e9 / 8
    doc = {"bandwidth_gbps": 40, "island": [{"name": "Tokyo"},
                                            {"name": "Lab", "lat": 48.1, "lon": 11.6, "bandwidth_gbps": 10}]}
    j = load_topology(_write(tmp_path, json.dumps(doc), "t.json"))
    assert (j.latency == t.latency).all()


@pytest.mark.parametrize("text,needle", [
    ('[[island]]\nname = "Tokyo"\n[[island]]\nname = "Atlantis"\n', "unknown city 'Atlantis'"),
    ('[[island]]\nname = "Tokyo"\nbandwidth_gbps = -5\n[[island]]\nname = "London"\n',
     "negative or zero bandwidth"),
    ('[[island]]\nname = "Tokyo"\n[[island]]\nname = "London"\n[[island]]\nname = "Paris"\n'
     '[[link]]\na = "London"\nb = "Paris"\n', "disconnected graph"),
    ('[[island]]\nname = "Tokyo"\n[[island]]\nname = "London"\n[[link]]\na = "Tokyo"\nb = "Mars"\n',
     "unknown island 'Mars'"),
    ('[[island]]\nname = "Tokyo"\n[[island]]\nname = "London"\n[[link]]\na = "Tokyo"\nb = "London"\n'
     'capacity_gbps = -1\n', "negative or zero capacity"),
    ('[[island]]\nname = "Tokyo"\n', "at least 2 islands"),
    ('[[island]]\nname = "Tokyo"\n[[island]]\nname = "Tokyo"\n', "duplicate island"),
    ('[[island]]\nname = "Tokyo"\ncolour = "red"\n[[island]]\nname = "London"\n', "unknown keys"),
    ('this is = = not toml', "cannot parse"),
])
def test_bad_files_rejected(tmp_path, text, needle):
    p = _write(tmp_path, text)
    with pytest.raises(WanTopologyError, match=needle):
        load_topology(p)


def test_cli_reports_bad_topology_as_one_line(tmp_path, capsys):
    p = _write(tmp_path, '[[island]]\nname = "Tokyo"\n[[island]]\nname = "Atlantis"\n')
    rc = main(["schedule", "optimize", "--topology", str(p), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "unknown city 'Atlantis'" in err and str(p) in err


def test_cli_missing_file(tmp_path, capsys):
    rc = main(["schedule", "topology", "--topology", str(tmp_path / "nope.toml")])
    assert rc == 2 and "nope.toml" in capsys.readouterr().err


def test_default_file_is_shipped():
    assert DEFAULT_TOPOLOGY_PATH.exists()
