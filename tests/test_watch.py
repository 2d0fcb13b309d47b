"""Watching a running switch: `ina switch --metrics` serves every counter, switch-wide and
per job, and each job's figures in the Prometheus text format, and `ina top --once` draws the jobs,
rates, waiting_for and drops; both against a real switch with a live job."""

import os
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from ina_fabric.protocol import pack
from ina_fabric.protocol.control_client import query_status

pytest.importorskip("prometheus_client")
pytest.importorskip("rich")

INA = [sys.executable, "-m", "ina_fabric.host.cli"]
SESSION = 0x5EED


@pytest.fixture
def live_job(ports):
    """A switch with job 1 of two workers, and worker 0's first DATA in: the slot is open
    and waits for worker 1."""
    sport, w0, w1, mport = ports(4)
    proc = subprocess.Popen(INA + ["switch", "--listen", f"127.0.0.1:{sport}",
                                   "--workers", f"127.0.0.1:{w0},127.0.0.1:{w1}",
                                   "--elements", "16", "--mode", "reliable",
                                   "--session", str(SESSION),
                                   "--metrics", f"127.0.0.1:{mport}"],
                            stderr=subprocess.PIPE, text=True)
    addr = ("127.0.0.1", sport)
    for _ in range(150):
        try:
            query_status(addr, timeout=0.1)
            break
        except OSError:
            time.sleep(0.1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", w0))
    s.sendto(pack(np.arange(16), job=1, worker=0, seq=0, session=SESSION), addr)
    for _ in range(50):
        if query_status(addr)["counters"]["accepted"] == 1:
            break
        time.sleep(0.05)
    yield proc, addr, mport
    s.close()
    proc.terminate()
    proc.wait(timeout=10)


def _scrape(mport) -> dict:
    from prometheus_client.parser import text_string_to_metric_families
    for _ in range(50):
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics",
                                          timeout=5).read().decode()
            break
        except OSError:
            time.sleep(0.1)
    out = {}
    for fam in text_string_to_metric_families(body):
        for smp in fam.samples:
            out[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return out


def test_metrics_serve_a_live_jobs_counters(live_job):
    proc, addr, mport = live_job
    m = _scrape(mport)
    assert m[("ina_switch_up", ())] == 1
    assert m[("ina_switch_accepted_total", ())] == 1
    assert m[("ina_switch_rx_data_total", ())] == 1
    job = (("job", "1"),)
    assert m[("ina_job_workers", job)] == 2 and m[("ina_job_open_slots", job)] == 1
    assert m[("ina_job_waiting_for", job)] == 1
    assert m[("ina_job_waiting_for_worker", (("job", "1"), ("worker", "1")))] == 1
    # every counter the switch reports is served
    names = {n for n, _ in m}
    for counter in query_status(addr)["counters"]:
        assert f"ina_switch_{counter}_total" in names, counter
    assert proc.poll() is None


def test_metrics_serve_every_counter_per_job(live_job, ports):
    """Each job's own counters, ``ina_job_<counter>_total{job=...}``, for every per-job
    counter: a second job's DATA (one summed, one duplicate) and a DATA of the first job
    with another run's session move only their own job's series, and the switch's totals
    are their sum. The scrape is a real HTTP GET, with curl where it is installed."""
    import shutil
    from ina_fabric.protocol.control_client import send_job
    from ina_fabric.protocol.counters import JOB_COUNTERS
    from ina_fabric.protocol.jobtable import JobConfig
    proc, addr, mport = live_job
    (x,) = ports(1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    me = f"127.0.0.1:{s.getsockname()[1]}"
    send_job(addr, JobConfig(2, (me, f"127.0.0.1:{x}"), elements=16, session=7))
    for seq in (0, 0):                                   # summed, then a duplicate
        s.sendto(pack(np.arange(16), job=2, worker=0, seq=seq, session=7), addr)
    for _ in range(50):
        if query_status(addr)["counters"]["duplicates"] == 1:
            break
        time.sleep(0.05)
    m = _scrape(mport)
    one, two = (("job", "1"),), (("job", "2"),)
    for name in JOB_COUNTERS:                          # every per-job counter, every job
        assert (f"ina_job_{name}_total", one) in m and (f"ina_job_{name}_total", two) in m
    assert m[("ina_job_accepted_total", one)] == 1 and m[("ina_job_accepted_total", two)] == 1
    assert m[("ina_job_duplicates_total", one)] == 0
    assert m[("ina_job_duplicates_total", two)] == 1
    assert m[("ina_job_rx_data_total", two)] == 2
    for name in ("accepted", "duplicates", "rx_data"):
        assert m[(f"ina_switch_{name}_total", ())] == \
            m[(f"ina_job_{name}_total", one)] + m[(f"ina_job_{name}_total", two)]
    if shutil.which("curl"):                           # what the docs show a user
        out = subprocess.run(["curl", "-sf", f"http://127.0.0.1:{mport}/metrics"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0
        assert 'ina_job_duplicates_total{job="2"} 1.0' in out.stdout
    s.close()
    assert proc.poll() is None


def test_top_once_draws_the_jobs_rates_waiting_for_and_drops(live_job):
    _, addr, _ = live_job
    out = subprocess.run(INA + ["top", "--once", "--interval", "0.2", "--switch",
                                f"127.0.0.1:{addr[1]}"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "COLUMNS": "160"})
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "1 job(s)" in text and "waiting_for" in text and "reliable" in text
    assert "accepted" in text and "drop_unknown_job" in text
    row = next(line for line in text.splitlines() if "reliable" in line)
    assert row.split("│")[-2].strip() == "1"          # waits for worker 1


def test_top_and_metrics_say_why_in_one_line():
    out = subprocess.run(INA + ["top", "--once", "--interval", "0.1", "--switch",
                                "127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no answer from switch" in out.stderr
    assert out.stderr.count("\n") == 1
    out = subprocess.run(INA + ["switch", "--listen", "127.0.0.1:0", "--metrics", "x:y"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--metrics 'x:y'" in out.stderr
