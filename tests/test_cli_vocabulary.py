"""One CLI vocabulary: sizes mean the same in every command, job defaults come from one
place, and output goes where --out says."""

import pytest

from ina_fabric.host.cli import build_parser
from ina_fabric.host.commands._common import parse_size
from ina_fabric.protocol.jobtable import LINK_DEFAULTS, JobConfig, job_defaults


@pytest.mark.parametrize("text,value", [
    ("65536", 65536), ("1e9", 10 ** 9), ("256K", 256 << 10), ("256k", 256 << 10),
    ("4M", 4 << 20), ("4MB", 4 << 20), ("4MiB", 4 << 20), ("4 mib", 4 << 20),
    ("1G", 1 << 30), ("1.5K", 1536), ("2T", 2 << 40),
])
def test_sizes_have_one_meaning(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "4X", "M", "4MiBs", "iB", "-4M", "4 M B"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(ValueError, match="bad size"):
        parse_size(text)


def test_the_same_size_in_two_commands():
    """`ina allreduce --size` and `ina schedule --update-bytes` read 4MiB alike (the
    schedule command read k/M/G as powers of 1000 before, allreduce as 1024)."""
    from ina_fabric.host.commands.schedule import parse_size as schedule_size
    a = build_parser().parse_args(["allreduce", "--size", "4MiB"])
    assert a.size == schedule_size("4MiB") == schedule_size("4M") == 4 << 20


def test_job_defaults_live_in_one_place():
    """Every default of window, elements, deadline and mode comes from LINK_DEFAULTS."""
    from ina_fabric.host.cluster import WorkerSpec
    from ina_fabric.host.ddp.train import TrainConfig
    from ina_fabric.host.transport.switch_client import SwitchClient
    from ina_fabric.host.collectives import SwitchTarget
    eth, lo = LINK_DEFAULTS["ethernet"], LINK_DEFAULTS["loopback"]
    assert JobConfig(1, ("127.0.0.1:1",)).settings == eth
    assert WorkerSpec().settings == lo
    t = TrainConfig()
    assert (t.window, t.elements, t.deadline_ms) == (lo.window, lo.elements, lo.deadline_ms)
    fields = SwitchClient.__dataclass_fields__
    assert (fields["window"].default, fields["elements"].default,
            fields["deadline"].default) == (eth.window, eth.elements, eth.deadline)
    assert SwitchTarget(("127.0.0.1", 1)).window == eth.window
    for verb, link in (("allreduce", "loopback"), ("switch", "ethernet")):
        a = build_parser().parse_args([verb])
        d = LINK_DEFAULTS[link]
        assert (a.window, a.elements, a.deadline_ms, a.mode) == \
            (d.window, d.elements, d.deadline_ms, d.mode), verb
    assert job_defaults("loopback", elements=None, window=8).window == 8


def test_toml_and_flags_agree_on_deadline_units(tmp_path):
    from ina_fabric.protocol.jobtable import load_jobs_toml
    p = tmp_path / "jobs.toml"
    p.write_text('[[job]]\nid = 1\nworkers = ["127.0.0.1:1"]\ndeadline_ms = 7.5\n')
    job, = load_jobs_toml(p)
    a = build_parser().parse_args(["switch", "--deadline-ms", "7.5"])
    assert job.deadline == a.deadline_ms / 1e3 == 0.0075
