"""The leaf option's configuration side (hw/ina/leaf.py, docs/gateware.md "A leaf"): the
core's parameters, the register writes of a leaf's entry and of its parent. The leaf's
behaviour is the cocotb bench's (tests/test_sim_ina_core.py, test_sim_ina_tree_leaf)."""

import pytest

from ina_fabric.hw.ina.params import CoreParams, LEAF_META_BITS
from ina_fabric.protocol.jobtable import JobConfig
from ina_fabric.protocol.regs import (config_writes, job_reg_addr, parent_writes,
                                      register_map_text, GLOBAL_REGS)


def _leaf(index=3):
    return JobConfig(5, ("10.1.0.1:5000", "10.1.0.2:5001"), window=4, elements=8,
                     parent=("10.0.0.200", 4791), index=index)


def test_a_leaf_needs_the_tree_option():
    with pytest.raises(ValueError, match="leaf=True needs tree=True"):
        CoreParams(leaf=True)
    P = CoreParams(tree=True, leaf=True)
    assert P.meta_bits == CoreParams(tree=True).meta_bits + LEAF_META_BITS
    assert "leaf" in P.describe()


def test_config_writes_of_a_leaf_entry():
    kw = dict(clock_hz=1e8, window_max=8, elements_max=8)
    with pytest.raises(ValueError, match="without the leaf option"):
        config_writes(_leaf(), 0, **kw, tree=True)
    w = dict(config_writes(_leaf(), 1, **kw, tree=True, leaf=True))
    assert w[job_reg_addr(1, "parent")] == 1 and w[job_reg_addr(1, "up_index")] == 3
    # a job without a parent on a leaf core: parent 0
    flat = JobConfig(6, ("10.1.0.1:5000",), window=4, elements=8)
    w = dict(config_writes(flat, 0, **kw, tree=True, leaf=True))
    assert w[job_reg_addr(0, "parent")] == 0 and w[job_reg_addr(0, "up_index")] == 0


def test_parent_writes():
    at = {r.name: r.offset for r in GLOBAL_REGS}
    w = dict(parent_writes(("10.0.0.200", 4791), "02:00:00:00:00:c8"))
    assert w == {at["parent_ip"]: 0x0A0000C8, at["parent_port"]: 4791,
                 at["parent_mac_hi"]: 0x0200, at["parent_mac_lo"]: 0x000000C8}
    text = register_map_text()
    assert "parent_ip" in text and "job.up_index" in text


def test_hw_config_writes_a_leaf_for_a_leaf_core_only():
    """``ina hw-config --format regs``: a leaf's entry needs ``--core-leaf`` and its
    parent's MAC; the parent's registers come first."""
    from ina_fabric.host.commands.hw_config import render
    kw = dict(core_window=8, core_elements=8)
    with pytest.raises(ValueError, match="without the leaf option"):
        render([_leaf()], "regs", **kw, core_tree=True)
    with pytest.raises(ValueError, match="--parent-mac"):
        render([_leaf()], "regs", **kw, core_leaf=True)
    out = render([_leaf()], "regs", **kw, core_leaf=True, parent_mac="02:00:00:00:00:c8")
    at = {r.name: r.offset for r in GLOBAL_REGS}
    assert out.index(f"0x{at['parent_ip']:04x} 0x0a0000c8") < out.index(
        f"0x{job_reg_addr(0, 'parent'):04x} 0x00000001")
