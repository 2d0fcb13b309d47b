"""PyTorch's own distributed test suite against the ``ina`` backend, side by side with Gloo.

PyTorch ships its suite in the wheel (``torch.testing._internal.distributed.
distributed_test``, class ``DistributedTest._DistTestBase``); upstream runs it through
``test/distributed/test_distributed_spawn.py``: ``BACKEND=gloo WORLD_SIZE=N``, one
``TestDistBackend`` subclass whose ``setUp`` spawns the ranks. This file is that driver,
run as a script in a subprocess (the module reads BACKEND and WORLD_SIZE at import):

    python tests/test_torch_upstream.py --backend ina --world 2 --json out.json [NAMES]

It imports the suite with ``BACKEND=gloo``, so the suite's own gates (skips, expected
errors, per-backend branches) are Gloo's: ``ina`` runs exactly the tests Gloo runs, the
same code, and only ``init_process_group`` names another backend. Each test gets a job id
of its own on a software switch this script starts. The selection (``SELECTION``) is the
CPU tests of all_reduce, DDP, barrier, broadcast, all_gather, reduce_scatter, new_group
and async; ``EXCEPTIONS`` lists the tests that pass on Gloo and cannot on ``ina``, each
with its reason (docs/backend.md repeats them).

In ``make test``: ``FAST`` at 2 ranks on ``ina`` (the failures of issue 44 among them).
INA_UPSTREAM=1: the whole selection on Gloo and on ``ina`` at 2 and 4 ranks (minutes);
every test that passes on Gloo passes on ``ina`` or is in ``EXCEPTIONS``.

The script starts the ranks with ``spawn``, as upstream's driver does; the tests here
set UPSTREAM_START=fork (unless it is set): each rank then starts from the driver's
imports, about 3 s a test instead of 30 on this shared machine.
"""

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: the selection: every test of ``_DistTestBase`` whose name matches ``SELECT`` and not
#: ``LEAVE_OUT`` (GPU-only, NCCL-only, profiler and compiler tests: none of them runs on a
#: CPU Gloo group here)
SELECT = r"all_reduce|ddp|barrier|broadcast|all_gather|reduce_scatter|new_group|async"
LEAVE_OUT = r"cuda|gpu|nccl|profil|compile|device_mesh|_v_cuda"

#: in the default suite: one of each kind, and each failure of issue 44's table
FAST = ["test_all_reduce_sum", "test_all_reduce_sum_async", "test_sparse_all_reduce_sum",
        "test_ddp_create_graph", "test_broadcast", "test_barrier"]

#: tests that pass on Gloo and cannot pass on ``ina``, with the reason (docs/backend.md)
_MONITORED = ("calls dist.monitored_barrier, which torch refuses for a backend not named "
              "gloo: \"monitored_barrier is only implemented for GLOO backend.\" "
              "(ina_fabric.distributed.monitored_barrier runs it on the group's Gloo)")
EXCEPTIONS: dict[str, str] = {
    "test_monitored_barrier_gloo": _MONITORED,
    "test_monitored_barrier_gloo_subgroup": _MONITORED,
}


def selection(names):
    return sorted(n for n in names if re.search(SELECT, n) and not re.search(LEAVE_OUT, n))


# -- the driver (a subprocess; its ranks are spawned from it) ---------------------------
def _define():
    """The upstream test class, on Gloo's gates, initialising ``UPSTREAM_BACKEND``."""
    from datetime import timedelta
    import torch.distributed as dist
    from torch.testing._internal import common_distributed as cd
    from torch.testing._internal.distributed import distributed_test as dt
    import ina_fabric.distributed  # noqa: F401  (registers "ina" in every rank)

    backend = os.environ["UPSTREAM_BACKEND"]
    limit = int(os.environ.get("UPSTREAM_TIMEOUT", "180"))
    cd.TIMEOUT_DEFAULT = limit
    cd.TIMEOUT_OVERRIDE.clear()

    class Upstream(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self):
            # a switch job per test: a test that fails leaves its job behind (as a
            # crash does), the next one must not be refused for it
            Upstream.job = getattr(Upstream, "job", int(os.environ.get("INA_JOB", "100")))
            Upstream.job += 50
            os.environ["INA_JOB"] = str(Upstream.job)
            super().setUp()
            if os.environ.get("UPSTREAM_START") == "fork":
                import torch.multiprocessing as tmp   # faster (no import per rank);
                self._start_processes(tmp.get_context("fork").Process)   # not upstream's
            else:
                self._spawn_processes()     # as upstream's driver

        @classmethod
        def _run(cls, rank, test_name, file_name, pipe, **kwargs):
            # upstream's TestDistBackend._run, with ``backend`` in init_process_group
            self = cls(test_name)
            self.rank = rank
            self.file_name = file_name
            timeout = timedelta(seconds=dt.CUSTOM_PG_TIMEOUT.get(test_name,
                                                                 dt.default_pg_timeout))
            dist.init_process_group(init_method=self.init_method, backend=backend,
                                    world_size=int(self.world_size), rank=self.rank,
                                    timeout=timeout)
            self._barrier()
            self.run_test(test_name, pipe)
            self._barrier()
            dist.destroy_process_group()
            sys.exit(0)

    Upstream.__qualname__ = Upstream.__name__ = "Upstream"
    return Upstream


if os.environ.get("UPSTREAM_BACKEND"):      # the driver and its spawned ranks
    Upstream = _define()


#: a software switch until its stdin closes
SWITCH = """
import multiprocessing as mp, sys
from ina_fabric.host.cluster import start_switch_process
addr, proc = start_switch_process(mp.get_context("fork"))
print(f"{addr[0]}:{addr[1]}", flush=True)
sys.stdin.read()
proc.terminate()
proc.join(5)
"""


def drive(names, out):
    import unittest
    proc = None
    if os.environ["UPSTREAM_BACKEND"] == "ina" and not os.environ.get("INA_SWITCH"):
        # in a process of its own, not a multiprocessing child: upstream's harness
        # terminates every active child of this process when a rank errors
        proc = subprocess.Popen([sys.executable, "-c", SWITCH], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        os.environ["INA_SWITCH"] = proc.stdout.readline().strip()
    all_names = [n for n in dir(Upstream) if n.startswith("test_")]
    names = names or selection(all_names)
    unknown = sorted(set(names) - set(all_names))
    if unknown:
        raise SystemExit(f"not in the upstream suite: {', '.join(unknown)}")
    res, times = {}, {}

    class Result(unittest.TextTestResult):
        def addSuccess(self, test):
            super().addSuccess(test)
            res[test._testMethodName] = "pass"

        def addFailure(self, test, err):
            super().addFailure(test, err)
            res[test._testMethodName] = "fail: " + self._exc_info_to_string(err, test)[-1500:]

        def addError(self, test, err):
            super().addError(test, err)
            res[test._testMethodName] = "fail: " + self._exc_info_to_string(err, test)[-1500:]

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            res[test._testMethodName] = "skip: " + str(reason)

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            res[test._testMethodName] = "pass"

        def startTest(self, test):
            times[test._testMethodName] = time.monotonic()
            super().startTest(test)

        def stopTest(self, test):
            super().stopTest(test)
            n = test._testMethodName
            times[n] = round(time.monotonic() - times[n], 1)
            with open(out, "w") as f:      # as it goes: a killed run keeps what it had
                json.dump({"backend": os.environ["UPSTREAM_BACKEND"],
                           "world": int(os.environ["WORLD_SIZE"]), "results": res,
                           "seconds": times}, f, indent=1)

    suite = unittest.TestSuite(Upstream(n) for n in names)
    try:
        unittest.TextTestRunner(resultclass=Result, verbosity=2).run(suite)
    finally:
        if proc is not None:
            proc.stdin.close()              # it stops its switch
            proc.wait(10)


def run_upstream(backend, world, names=(), timeout=1800, per_test=180):
    """Run the driver in a subprocess; {name: "pass" | "fail: ..." | "skip: ..."}."""
    with tempfile.TemporaryDirectory(prefix="ina-upstream-") as tmp:
        out = pathlib.Path(tmp) / "out.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "UPSTREAM_TIMEOUT": str(per_test),
               "UPSTREAM_START": os.environ.get("UPSTREAM_START", "fork"),
               "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        env.pop("INA_SWITCH", None)
        p = subprocess.run([sys.executable, __file__, "--backend", backend, "--world",
                            str(world), "--json", str(out), *names], env=env,
                           capture_output=True, text=True, timeout=timeout)
        if not out.exists():
            raise AssertionError(f"the driver wrote nothing (rc {p.returncode}): "
                                 f"{p.stdout[-2000:]}{p.stderr[-3000:]}")
        return json.loads(out.read_text())["results"]


def counts(results):
    c = {"pass": 0, "fail": 0, "skip": 0}
    for v in results.values():
        c[v.split(":")[0]] += 1
    return c


# -- the tests ---------------------------------------------------------------------------
pytestmark = [pytest.mark.xdist_group("torch")]
pytest.importorskip("expecttest", reason="torch's test utilities need expecttest")


def test_fast_subset_passes_on_ina():
    """(test_sparse_all_reduce_sum raised NotImplementedError for SparseCPU, and
    test_ddp_create_graph crashed both ranks with SIGSEGV, before issue 44)"""
    res = run_upstream("ina", 2, FAST, timeout=600)
    assert res == {n: "pass" for n in FAST}, res


@pytest.mark.skipif(not os.environ.get("INA_UPSTREAM"),
                    reason="the whole upstream selection takes minutes: INA_UPSTREAM=1")
@pytest.mark.parametrize("world", [2, 4])
def test_every_test_that_passes_on_gloo_passes_on_ina(world):
    gloo = run_upstream("gloo", world, timeout=3600)
    ina = run_upstream("ina", world, timeout=3600)
    assert set(gloo) == set(ina)
    print(f"world {world}: gloo {counts(gloo)}, ina {counts(ina)}")
    missing = {n: ina[n] for n, v in gloo.items()
               if v == "pass" and ina[n] != "pass" and n not in EXCEPTIONS}
    assert not missing, missing


def test_exceptions_are_documented():
    doc = (ROOT / "docs" / "backend.md").read_text()
    for name in EXCEPTIONS:
        assert f"`{name}`" in doc, name


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="ina", help="ina or gloo")
    ap.add_argument("--world", type=int, default=2, help="ranks")
    ap.add_argument("--json", required=True, help="where the results go")
    ap.add_argument("--list", action="store_true", help="print the selection and exit")
    ap.add_argument("names", nargs="*", help="tests to run (default: the selection)")
    a = ap.parse_args()
    if not os.environ.get("UPSTREAM_BACKEND"):
        # the module reads these at import, in this process and in every spawned rank
        tmp = tempfile.mkdtemp(prefix="ina-upstream-")
        for d in ("barrier", "test_dir"):
            os.makedirs(os.path.join(tmp, d))
        env = {**os.environ, "UPSTREAM_BACKEND": a.backend, "BACKEND": "gloo",
               "WORLD_SIZE": str(a.world), "TEMP_DIR": tmp}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    if a.list:
        print("\n".join(selection(n for n in dir(Upstream) if n.startswith("test_"))))
        sys.exit(0)
    drive(a.names, a.json)
