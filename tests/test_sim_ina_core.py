"""cocotb benches of the INA core (Icarus), checked packet by packet against the model.

Each test builds the core for one parameter set in its own build/sim/<name> directory.
"""

import dataclasses
import json
import os

import pytest

from ina_fabric.hw.ina.core import InaCore
from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.sim.common import run_cocotb

pytestmark = pytest.mark.xdist_group("sim_ina")


def _run(params, name, testcase, planted_bug=None, control_key=None, error_interval=None,
         **env):
    core = InaCore(params, planted_bug=planted_bug, control_key=control_key,
                   error_interval=error_interval)
    # (the bench's scoreboard answers refused DATA as often as this core: INA_ERR_CYCLES)
    env = {"INA_PARAMS": json.dumps(dataclasses.asdict(params)),
           "INA_ERR_CYCLES": str(core.error_interval), **env}
    run_cocotb(core,
               toplevel="ina_core",
               test_module="ina_fabric.sim.ina.tb_core", name=name, testcase=testcase, env=env)


P_L1 = CoreParams(workers=32, window=8, elements=8, lanes=1, jobs=2)
P_L8 = CoreParams(workers=32, window=4, elements=8, lanes=8, jobs=2)
#: the randomized run: short packets (H=2, B=1 beats) so 10k packets fit in CI time
P_RND = CoreParams(workers=8, window=4, elements=4, lanes=4, jobs=2)
RANDOM_SEQS = 1350  # x (4 + 3 workers) + impairments: > 10k datagrams


#: the directed benches' cycles between two ERRORs to one source bucket (short, so a
#: scenario can wait it out: sim/ina/refusals.py)
from ina_fabric.sim.ina.refusals import REFUSAL_INTERVAL  # noqa: E402
#: the random run's: short enough that most sources are answered more than once
RANDOM_ERR_CYCLES = 97


def test_sim_ina_directed_and_back_to_back_L1():
    _run(P_L1, "ina_L1", ["test_directed", "test_back_to_back", "test_refusals",
                          "test_refusal_flood"], error_interval=REFUSAL_INTERVAL)


def test_sim_ina_directed_and_back_to_back_L8():
    _run(P_L8, "ina_L8", ["test_directed", "test_back_to_back", "test_refusals",
                          "test_refusal_flood"], error_interval=REFUSAL_INTERVAL)


def test_sim_ina_refusal_flood_every_answer():
    """The flood with an answer to every refused DATA (1 cycle between two answers to a
    bucket: header-only refusals come one a cycle at 8 lanes, the output stalls at
    random): the answer queue fills, the header pipeline stops for it, no answer is lost
    or reordered, and the bytes out stay below the bytes in."""
    _run(P_L8, "ina_L8_flood", "test_refusal_flood", error_interval=1, INA_FLOOD_STOP=1)


def test_sim_ina_random_10k():
    _run(P_RND, "ina_random", "test_random", INA_NSEQ=RANDOM_SEQS, INA_SEED=1,
         INA_E=P_RND.elements, INA_MIN_PACKETS=10000, INA_DEADLINE=100,
         error_interval=RANDOM_ERR_CYCLES)


#: the core as a spine of a tree of switches (CoreParams.tree; sim/ina/tree.py)
P_TREE = CoreParams(workers=8, window=4, elements=4, lanes=4, jobs=2, tree=True)


def test_sim_ina_tree_spine():
    """The core as the spine of a two-level tree whose leaves are models: every output
    and counter as a model spine's (INA_SIM_FULL=1: more seqs and a second seed)."""
    full = bool(os.environ.get("INA_SIM_FULL"))
    for seed in ((1, 2) if full else (1,)):
        _run(P_TREE, "ina_tree_spine", "test_tree_spine", INA_NSEQ=400 if full else 60,
             INA_SEED=seed, INA_E=P_TREE.elements, INA_DEADLINE=300)


def test_sim_ina_tree_spine_planted_bug_is_caught():
    """A spine that counts a child switch's DATA as one worker fails the bench."""
    with pytest.raises(AssertionError, match="cocotb tests failed"):
        _run(P_TREE, "ina_bug_child_counts_one", "test_tree_spine",
             planted_bug="child_counts_one", INA_NSEQ=20, INA_SEED=1,
             INA_E=P_TREE.elements, INA_DEADLINE=300)


#: the core as a leaf (CoreParams.leaf; hw/ina/leaf.py, sim/ina/tree_leaf.py)
P_LEAF = CoreParams(workers=8, window=4, elements=4, lanes=4, jobs=2, tree=True, leaf=True)


@pytest.mark.timeout(3600)    # (INA_SIM_FULL: three seeds of 300 seqs, 15+ minutes)
def test_sim_ina_tree_leaf():
    """The core as a leaf of a two-level tree whose parent is a model spine, the loop
    closed while it runs: every output and counter as a model leaf's (INA_SIM_FULL=1:
    more seqs and two more seeds)."""
    full = bool(os.environ.get("INA_SIM_FULL"))
    for seed in ((1, 2, 3) if full else (1,)):
        _run(P_LEAF, "ina_tree_leaf", "test_tree_leaf", INA_NSEQ=300 if full else 40,
             INA_SEED=seed, INA_E=P_LEAF.elements, INA_DEADLINE=120)


def test_sim_ina_tree_leaf_one_member():
    """A leaf job of one worker: its DATA reuses a record and closes it at once, which
    must send it up (the first leaf core sent nothing: the record was neither complete
    nor up)."""
    _run(P_LEAF, "ina_tree_leaf_one", "test_tree_leaf", INA_NSEQ=30, INA_SEED=4,
         INA_E=P_LEAF.elements, INA_DEADLINE=120, INA_LEAF_WORKERS="1,3")


def test_sim_ina_tree_leaf_planted_bug_is_caught():
    """A leaf that relays its members' bitmap when the parent's RESULT lacks its bit (its
    members are not in the sum) fails the bench."""
    with pytest.raises(AssertionError, match="cocotb tests failed"):
        _run(P_LEAF, "ina_bug_relay_bitmap", "test_tree_leaf",
             planted_bug="relay_ignores_parent_bitmap", INA_NSEQ=40, INA_SEED=1,
             INA_E=P_LEAF.elements, INA_DEADLINE=120)


def test_sim_ina_random_tree_core():
    """A core built with the tree option runs ordinary (worker) jobs as before: the
    randomized bench of test_sim_ina_random_10k, shorter."""
    _run(P_TREE, "ina_random_tree", "test_random", INA_NSEQ=300, INA_SEED=3,
         INA_E=P_TREE.elements, INA_DEADLINE=100)


#: narrow widths (issue 40): int8 and int16 packed into L = 2 lane words, partial last words
P_WIDTHS = CoreParams(workers=8, window=4, elements=6, lanes=2, jobs=2, widths=(8, 16, 32))


def _model_takes_widths():
    import inspect
    from ina_fabric.host.switch.model import SwitchModel
    return "widths" in inspect.signature(SwitchModel).parameters


@pytest.mark.skipif(not _model_takes_widths(),
                    reason="the reference model has no element widths yet (issue 40's model)")
def test_sim_ina_random_widths():
    """Random traffic whose seqs draw int8, int16 or int32 (with every impairment, width
    bytes the core does not take, overflow at each width, idle cycles and backpressure),
    against the model with the same widths."""
    full = bool(os.environ.get("INA_SIM_FULL"))
    _run(P_WIDTHS, "ina_random_widths", "test_random", INA_NSEQ=1200 if full else 80,
         INA_SEED=3, INA_E=P_WIDTHS.elements, INA_DEADLINE=100)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("params", [
    P_L1, pytest.param(P_L8, marks=pytest.mark.skipif(
        not os.environ.get("INA_SIM_FULL"), reason="long tier: INA_SIM_FULL=1"))],
    ids=["L1", "L8"])
def test_sim_ina_control(params):
    """In-band CONTROL: accepted, refused, unauthenticated (another key, altered,
    replayed), malformed, live update (slots kept) vs install (slots afresh), removal,
    a full job table; every output and counter as the model's (sim/ina/control_scenario)."""
    from ina_fabric.sim.ina.control_scenario import KEY
    _run(params, f"ina_control_L{params.lanes}", "test_control", control_key=KEY)


@pytest.mark.parametrize("bug,scenario", [("wrapping_adder", "overflow"),
                                          ("no_duplicate_check", "duplicate_open")])
def test_sim_ina_planted_bug_is_caught(bug, scenario):
    """A planted RTL bug makes the scoreboard fail (and the real design passes the same
    scenario in the directed tests above)."""
    with pytest.raises(AssertionError, match="cocotb tests failed"):
        _run(P_L8, f"ina_bug_{bug}", "test_directed", planted_bug=bug,
             INA_SCENARIO=scenario)
