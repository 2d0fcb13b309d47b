"""Coverage-driven cocotb benches of the INA core (sim/ina/coverage.py): random traffic
aimed at the coverage bins, then the directed sweeps across each timing compare (the
deadline, the reuse of a record while its result is sent), checked against the model
packet by packet, with each result's delivery timed and ordered per destination; every
bin must be hit.

One core per lane count L in {1, 4, 8}, E spanning three element beats, the bounded
job at every index of the job table (one seed per index by default). More seeds:
``INA_SIM_SEEDS=N``; longer runs: ``INA_COV_NSEQ=N`` (seqs per job and seed, default 40).
"""

import dataclasses
import json
import os

import pytest

from ina_fabric.hw.ina.core import InaCore
from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.sim.common import run_cocotb, BUILD

pytestmark = pytest.mark.xdist_group("sim_ina")

#: (L, core): E = three element beats; W the core's; three jobs at L = 1
COV_CONFIGS = {
    1: CoreParams(workers=8, window=4, elements=3, lanes=1, jobs=3),
    4: CoreParams(workers=8, window=4, elements=12, lanes=4, jobs=2),
    8: CoreParams(workers=8, window=4, elements=20, lanes=8, jobs=2),
}


def run_coverage(P, name, core=None, **env):
    out = BUILD / name / "coverage.json"
    env = {"INA_PARAMS": json.dumps(dataclasses.asdict(P)), "INA_COV_OUT": str(out),
           **{k: os.environ[k] for k in ("INA_SIM_SEEDS", "INA_COV_NSEQ", "INA_SEED")
              if k in os.environ}, **env}
    run_cocotb(core or InaCore(P), toplevel="ina_core",
               test_module="ina_fabric.sim.ina.tb_core", name=name,
               testcase="test_coverage", env=env)
    return json.loads(out.read_text())


@pytest.mark.parametrize("lanes", sorted(COV_CONFIGS))
def test_sim_ina_coverage(lanes):
    cov = run_coverage(COV_CONFIGS[lanes], f"ina_cov_L{lanes}")
    missed = [n for n in cov["required"] if not cov["hits"].get(n)]
    assert not missed, missed
