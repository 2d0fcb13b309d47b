"""A run restarted after a crash takes its job id back at once (issue 44): under
``torchrun --max-restarts`` through the run's tag in the session id, anywhere else with
INA_TAKEOVER=1 (a key holder's explicit takeover); and nothing of the crashed run reaches
the new one. Before, the restart was refused for the switch's idle reclaim time (60 s):
``JobRefused: job 1 is taken by another run``."""

import datetime
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from ina_fabric.distributed import InaOptions, ProcessGroupIna
from ina_fabric.host.cluster import free_tcp_port
from ina_fabric.host.ddp.backend import run_session, run_tag
from ina_fabric.host.switch import JobRefused, query_status

pytestmark = pytest.mark.xdist_group("torch")

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def env(monkeypatch, ina_switch):
    for k in ("INA_FALLBACK", "INA_DTYPES", "INA_STATIC_JOB", "INA_PORT", "INA_JOB",
              "INA_SESSION", "INA_MODE", "INA_TAKEOVER", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("INA_SWITCH", f"{ina_switch[0]}:{ina_switch[1]}")
    monkeypatch.setenv("INA_ELEMENTS", "256")
    return monkeypatch


def test_torchrun_restart_takes_the_job_back(env, ina_switch, tmp_path):
    """Attempt 0 leaves job 41 installed with a slot half full (rank 0 sent, rank 1
    crashed); torchrun restarts both; attempt 1 takes the id back at once, under a new
    session with the same run tag, and sums exactly."""
    before = query_status(ina_switch)["counters"]
    e = {**os.environ, "INA_JOB": "41", "OMP_NUM_THREADS": "1",
         "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--max-restarts", "1", "--monitor-interval", "0.2", "--master-addr",
           "127.0.0.1", "--master-port", str(free_tcp_port()),
           str(ROOT / "tests" / "backend_ranks.py"), "--restart", str(tmp_path / "r")]
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    runs = {(a, r): json.loads((tmp_path / f"r.attempt{a}.rank{r}.json").read_text())
            for a in range(2) for r in range(2)}
    old, new = runs[0, 0]["session"], runs[1, 0]["session"]
    assert old != new and old >> 32 == new >> 32           # a new session, the same run
    assert all(runs[a, r]["sum"] == [3.0] for a in range(2) for r in range(2)), runs
    assert runs[1, 0]["warnings"] and f"{old:016x}" in runs[1, 0]["warnings"][0]
    assert runs[1, 1]["session"] == new and runs[1, 0]["calls"] == 1
    after = query_status(ina_switch)["counters"]
    assert "41" not in query_status(ina_switch)["jobs"]        # removed at the end
    assert after.get("results", 0) > before.get("results", 0)


def group(store, job, **options):
    return ProcessGroupIna(store, 0, 1, datetime.timedelta(seconds=20),
                           InaOptions(job=job, **options))


def test_a_run_started_again_takes_over_only_when_told(env, ina_switch):
    """Outside torchrun: a run that crashed (here: closed without removing its job)
    holds the id for the idle reclaim time; a second run is refused, unless
    INA_TAKEOVER=1. The crashed run's DATA is then dropped by the switch (another
    session), and the new run's sums are its own."""
    crashed = group(dist.HashStore(), 42, connect_timeout=0.5)
    crashed.state.installed = False          # (a crash: the job stays installed)
    with pytest.raises(JobRefused, match="job 42 is taken by another run"):
        group(dist.HashStore(), 42)
    drops = query_status(ina_switch)["counters"].get("drop_bad_session", 0)
    with pytest.warns(RuntimeWarning, match="job 42: took the id back from session "
                                            f"{crashed.state.collective.session:016x} "
                                            r"\(INA_TAKEOVER=1\)"):
        again = group(dist.HashStore(), 42, takeover=True)
    stale = torch.full((100,), 7.0)
    with pytest.raises(Exception):           # its session is gone: no result comes
        crashed.allreduce([stale]).wait()
    assert query_status(ina_switch)["counters"].get("drop_bad_session", 0) > drops
    t = torch.full((100,), 2.0)
    again.allreduce([t]).wait()
    assert torch.equal(t, torch.full((100,), 2.0)) and again.state.stats.calls == 1
    crashed.shutdown()
    again.shutdown()
    assert "42" not in query_status(ina_switch)["jobs"]


def test_the_run_tag_is_the_launchers(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert run_tag() is None
    env = {"TORCHELASTIC_RUN_ID": "job-7"}
    a, b = run_session(env), run_session(env)
    assert a != b and a >> 32 == b >> 32 == run_tag(env)
    assert run_tag({"TORCHELASTIC_RUN_ID": "job-8"}) != run_tag(env)
    # torchrun's default id: the agent (this process's parent) names the run
    assert run_tag({"TORCHELASTIC_RUN_ID": "none"}) == run_tag({"TORCHELASTIC_RUN_ID": ""})


EXIT_WITHOUT_DESTROY = r"""
import multiprocessing as mp, sys, torch, torch.distributed as dist
import ina_fabric.distributed
def rank(job):
    import os
    os.environ["INA_JOB"] = str(job)
    dist.init_process_group("ina", store=dist.HashStore(), rank=0, world_size=1)
    dist.all_reduce(torch.ones(10))
    sys.exit(0)                   # no destroy_process_group
if __name__ == "__main__":
    for job, how in ((44, "fork"), (45, "spawn")):   # a multiprocessing child
        p = mp.get_context(how).Process(target=rank, args=(job,))
        p.start()
        p.join(60)
        assert p.exitcode == 0, p.exitcode
    rank(46)                      # the main process
"""


def test_a_rank_that_exits_without_destroy_removes_its_job(env, ina_switch, tmp_path):
    """A process that ends without ``destroy_process_group`` (``sys.exit``; upstream's
    tests skip that way after init) left its job installed for good: on a software
    switch the slot memory stayed held, and after 42 such jobs every install was
    refused ("25141248 B of slot memory, but only 17809408 B of 1073741824 B are
    free"). Rank 0 now removes its job at exit, in a multiprocessing child too."""
    e = {**os.environ, "OMP_NUM_THREADS": "1",
         "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    script = tmp_path / "exit_without_destroy.py"      # (spawn needs a file)
    script.write_text(EXIT_WITHOUT_DESTROY)
    p = subprocess.run([sys.executable, str(script)], env=e, capture_output=True,
                       text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    assert not {"44", "45", "46"} & set(query_status(ina_switch)["jobs"])
