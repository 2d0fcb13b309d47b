"""The RTL engine (the gateware in Verilator, built with the tree option) as the spine of
a two-level tree of reference models, against the same tree with a model spine
(docs/gateware.md, "Trees of switches").

The random traffic of ``test_engine_tree``, int32 elements (loss and duplicates on every hop, re-sends,
late and silent workers, a RESULT sent to the spine, a child DATA claiming too many
workers), reliable mode (the RTL engine's bounded clock follows the wall clock). Every
datagram on the switch-to-switch links and every datagram a worker receives must be
identical, and the engine's live scoreboard (its own model spine) must never disagree
with the core. Long tier (a Verilator build of its own): ``INA_SIM_FULL=1``.
"""

import os

import numpy as np
import pytest

from ina_fabric.host.switch.model import SwitchModel

from ina_fabric.protocol import unpack
from ina_fabric.protocol.fields import MsgType

from tree_net import TreeNet, SPINE, tree_configs
from test_engine_tree import traffic

pytestmark = pytest.mark.xdist_group("rtl")
long_tier = pytest.mark.skipif(not os.environ.get("INA_SIM_FULL"),
                               reason="long tier: INA_SIM_FULL=1 (a Verilator build)")


def _why_not():
    from ina_fabric.host.switch.rtl import why_not
    return why_not()


def _params():
    from ina_fabric.hw.ina.params import CoreParams
    return CoreParams(workers=8, window=4, elements=8, lanes=4, jobs=2, tree=True)


def _leaf_params():
    from ina_fabric.hw.ina.params import CoreParams
    return CoreParams(workers=8, window=4, elements=8, lanes=4, jobs=2, tree=True, leaf=True)


def run(seed, spine=None, leaf0=None):
    rng = np.random.default_rng(seed)
    shape = [int(x) for x in rng.integers(1, 6, int(rng.integers(2, 6)))]
    E = int(rng.integers(1, 9))
    net = TreeNet(shape, spine=spine, leaf0=leaf0, loss=float(rng.choice([0.0, 0.05, 0.2])),
                  dup=float(rng.choice([0.0, 0.1])), seed=seed, mode="reliable",
                  window=int(2 ** rng.integers(1, 3)), elements=E)
    net.width_salt = seed
    # int32 only: the gateware sums int32 elements (narrow widths are not in it)
    traffic(net, rng, int(rng.integers(1, 12)), E, garbage=True, widths=(32,))
    return net


@long_tier
@pytest.mark.timeout(1800)
@pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))
@pytest.mark.parametrize("seed", range(6))
def test_an_rtl_spine_matches_a_model_spine(seed):
    from ina_fabric.host.switch.rtl import RtlSwitchModel
    P = _params()
    model = run(seed)
    rtl = run(seed, spine=lambda jobs: RtlSwitchModel(jobs, params=P))
    assert rtl.trunk == model.trunk
    assert rtl.received == model.received
    # the spine summed the leaves' counts: a complete RESULT covers every worker
    counts = [int(unpack(d)[0]["count"]) for _, src, _, d in model.trunk
              if src == SPINE and d[1] == MsgType.RESULT]
    assert counts and max(counts) == sum(model.shape)


@long_tier
@pytest.mark.timeout(1800)
@pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))
@pytest.mark.parametrize("seed", range(4))
def test_an_rtl_leaf_matches_a_model_leaf(seed):
    """The RTL engine built with the leaf option (hw/ina/leaf.py) as leaf 0 of the same
    random trees: the same datagrams on every switch-to-switch link and at every worker
    as the tree of models, and its live scoreboard never disagrees with the core."""
    from ina_fabric.host.switch.rtl import RtlSwitchModel
    P = _leaf_params()
    model = run(seed)
    engines = []

    def leaf0(jobs):
        engines.append(RtlSwitchModel(jobs, params=P))
        return engines[-1]
    rtl = run(seed, leaf0=leaf0)
    assert rtl.trunk == model.trunk
    assert rtl.received == model.received
    assert engines and engines[0].disagreements == 0
    # leaf 0 sent partial sums up and relayed the spine's RESULTs
    ups = [d for _, src, _, d in model.trunk if d[1] == MsgType.DATA]
    assert ups


@long_tier
@pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))
def test_the_rtl_engine_refuses_a_leaf():
    from ina_fabric.host.switch.rtl import RtlSwitchModel
    from ina_fabric.protocol.jobtable import ConfigError
    _, leaves = tree_configs([2, 3], window=4, elements=8)
    with pytest.raises(ConfigError, match="not a leaf"):
        RtlSwitchModel([leaves[0]], params=_params())


def test_config_writes_refuses_a_leaf_and_a_spine_without_the_tree_option():
    """The register path (``ina hw-config``, the board ROM, the RTL engine) refuses what
    the core cannot run, with a one-line reason; a spine on a tree core gets its two
    registers."""
    from ina_fabric.protocol.regs import config_writes, job_reg_addr
    spine, leaves = tree_configs([2, 3], window=4, elements=8)
    kw = dict(clock_hz=1e8, window_max=8, elements_max=8)
    with pytest.raises(ValueError, match="has a parent switch"):
        config_writes(leaves[0], 0, **kw, tree=True)
    # a core built with the leaf option takes it: its parent flag and member id there
    w = dict(config_writes(leaves[1], 0, **kw, tree=True, leaf=True))
    assert w[job_reg_addr(0, "parent")] == 1 and w[job_reg_addr(0, "up_index")] == 1
    with pytest.raises(ValueError, match="without the tree option"):
        config_writes(spine, 0, **kw)
    w = dict(config_writes(spine, 1, **kw, tree=True))
    assert w[job_reg_addr(1, "children")] == 1 and w[job_reg_addr(1, "total_workers")] == 5
    w = dict(config_writes(leaves[1].__class__(9, leaves[1].members, window=4, elements=8),
                           0, **kw, tree=True))
    assert w[job_reg_addr(0, "children")] == 0 and w[job_reg_addr(0, "total_workers")] == 3


def test_hw_config_writes_a_spine_for_a_tree_core_only():
    """``ina hw-config --format regs``: a spine's entry needs ``--core-tree``."""
    from ina_fabric.host.commands.hw_config import render
    from ina_fabric.protocol.regs import job_reg_addr
    spine, _ = tree_configs([2, 3], window=4, elements=8)
    with pytest.raises(ValueError, match="--core-tree"):
        render([spine], "regs", core_window=8, core_elements=8)
    out = render([spine], "regs", core_window=8, core_elements=8, core_tree=True)
    assert f"0x{job_reg_addr(0, 'total_workers'):04x} 0x00000005" in out
