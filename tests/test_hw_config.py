"""`ina hw-config`: the job-table bytes for the FPGA, checked against the job table and
the reference model."""

import subprocess
import sys

import pytest

from ina_fabric.host.commands.hw_config import render, control_datagram
from ina_fabric.host.switch.model import SwitchModel
from ina_fabric.protocol.jobtable import JobConfig
from ina_fabric.protocol.regs import job_reg_addr

JOBS = [JobConfig(7, ("10.0.0.1:5000@02:00:00:00:00:01", "10.0.0.2:5001"), window=4,
                  elements=32, deadline=0.002, mode="bounded"),
        JobConfig(8, ("10.0.0.3:5000",), window=8, elements=16, mcast=("239.1.1.1", 7000))]


def test_hex_and_bin_are_the_job_table_bytes():
    lines = render(JOBS, "hex").split()
    assert [JobConfig.from_bytes(bytes.fromhex(x)) for x in lines] == JOBS
    b = render(JOBS, "bin")
    n = int.from_bytes(b[:2], "big")
    assert JobConfig.from_bytes(b[2:2 + n]) == JOBS[0]


def test_control_datagram_configures_the_model():
    key = bytes(range(32))
    m = SwitchModel(key=key)
    m.process(control_datagram(JOBS[1], key), ("10.0.0.9", 1), 0.0)
    assert m.jobs[8].cfg == JOBS[1]


def test_regs_convert_deadline_to_cycles_and_reject_misfits():
    text = render(JOBS, "regs", clock_mhz=100.0)
    writes = [tuple(int(x, 16) for x in line.split()) for line in text.splitlines()
              if not line.startswith("#")]
    assert (job_reg_addr(0, "deadline"), 200000) in writes
    with pytest.raises(ValueError, match="job-table entries"):
        render(JOBS * 2, "regs")


def test_cli_error_is_one_line(tmp_path):
    cfg = tmp_path / "jobs.toml"
    cfg.write_text('[[job]]\nid = 1\nworkers = ["10.0.0.1:5000"]\nwindow = 6\n')
    r = subprocess.run([sys.executable, "-m", "ina_fabric.host.cli", "hw-config", str(cfg), "--format",
                        "regs"], capture_output=True, text=True)
    assert r.returncode == 2 and "power of two" in r.stderr
