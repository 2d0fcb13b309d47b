"""cocotb benches of the INA core (Icarus), checked packet by packet against the model."""

import dataclasses
import json

import pytest

from hw.ina.core import InaCore
from hw.ina.params import CoreParams
from sim.common import run_cocotb

pytestmark = pytest.mark.xdist_group("sim_ina")


def _run(params, name, testcase, planted_bug=None, **env):
    env = {"INA_PARAMS": json.dumps(dataclasses.asdict(params)), **env}
    run_cocotb(InaCore(params, planted_bug=planted_bug), toplevel="ina_core",
               test_module="sim.ina.tb_core", name=name, testcase=testcase, env=env)


P_L1 = CoreParams(workers=32, window=8, elements=8, lanes=1, jobs=2)
P_L2 = CoreParams(workers=32, window=8, elements=8, lanes=2, jobs=2)
P_L4 = CoreParams(workers=8, window=4, elements=8, lanes=4, jobs=3)
P_L8 = CoreParams(workers=32, window=4, elements=8, lanes=8, jobs=2)


def test_sim_ina_directed_L1():
    _run(P_L1, "ina_directed_L1", "test_directed")


def test_sim_ina_directed_L8():
    _run(P_L8, "ina_directed_L8", "test_directed")


def test_sim_ina_random_L2():
    _run(P_L2, "ina_random_L2", "test_random", INA_NSEQ=100, INA_SEED=1)


def test_sim_ina_back_to_back_L1():
    _run(P_L1, "ina_b2b_L1", "test_back_to_back")


def test_sim_ina_back_to_back_L8():
    _run(P_L8, "ina_b2b_L8", "test_back_to_back")
