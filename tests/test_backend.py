"""The ``ina`` torch.distributed backend under torchrun: the example script trains to
the demo's accuracy with 2 and 4 ranks (replicas bitwise identical), the same with the
comm hook, and a plain all_reduce loop plus the delegated collectives (and an all_reduce
whose size differs across ranks: refused on every rank, the job still in step)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from ina_fabric.host.cluster import free_tcp_port
from ina_fabric.host.switch import query_status

pytestmark = pytest.mark.xdist_group("torch")

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def switch(ina_switch):
    return ina_switch


def torchrun(nproc, script, args, switch, job, timeout=120, **env):
    e = {**os.environ, "INA_SWITCH": f"{switch[0]}:{switch[1]}", "INA_JOB": str(job),
         "INA_ELEMENTS": "8192", "OMP_NUM_THREADS": "1",
         "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **env}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_tcp_port()),
           str(script), *args]
    out = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def results(prefix, nproc):
    return [json.loads(pathlib.Path(f"{prefix}.rank{r}.json").read_text())
            for r in range(nproc)]


@pytest.mark.parametrize("nproc", [2, 4])
def test_example_trains_to_demo_accuracy_with_backend_ina(nproc, switch, tmp_path):
    before = query_status(switch)["counters"].get("results", 0)
    torchrun(nproc, ROOT / "examples" / "ddp_digits.py", ["--out", str(tmp_path / "r")],
             switch, job=10 + nproc)
    res = results(tmp_path / "r", nproc)
    assert all(r["backend"] == "ina" for r in res)
    assert all(r["accuracy"] >= 0.95 for r in res), res
    assert len({r["params_sha256"] for r in res}) == 1      # replicas bitwise identical
    assert query_status(switch)["counters"].get("results", 0) > before   # via the switch


def test_example_with_gradient_accumulation_and_the_hook(switch, tmp_path):
    torchrun(2, ROOT / "examples" / "ddp_digits.py",
             ["--accum", "2", "--out", str(tmp_path / "acc")], switch, job=20)
    torchrun(2, ROOT / "examples" / "ddp_digits_hook.py", ["--out", str(tmp_path / "hook")],
             switch, job=21)
    for prefix, backend in (("acc", "ina"), ("hook", "gloo")):
        res = results(tmp_path / prefix, 2)
        assert all(r["backend"] == backend and r["accuracy"] >= 0.95 for r in res), res
        assert len({r["params_sha256"] for r in res}) == 1


def test_plain_all_reduce_loop_and_delegated_collectives(switch, tmp_path):
    n = 2
    torchrun(n, ROOT / "tests" / "backend_ranks.py", [str(tmp_path / "c")], switch, job=30)
    res = results(tmp_path / "c", n)
    for r in res:
        assert r["backend"] == "ina" and r["switch_calls"] >= 24
        assert r["worst_over_bound"] <= 1.0, r
        assert r["async_sums"] == [float(sum(range(n)) + n * i) for i in range(4)]
        assert r["gathered"] == [float(i) for i in range(n)]
        assert r["broadcast"] == float(n - 1)
        assert r["objects"] == list(range(n))
        assert r["subgroup_sum"] == float(n) and r["subgroup_job"] != 30
        assert r["mismatch"] and "sizes differ across ranks" in r["mismatch"], r
        assert r["after_mismatch"] == [float(n)] * 700
    assert [x for r in res for x in r["reduce_scatter"]] == [float(n * i) for i in range(2 * n)]
