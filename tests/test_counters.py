"""Counter names defined once (``ina_fabric.protocol.counters``) and agreed by every
switch: the reference model, the C engine (through the generated ``ina_counters.h``)
and the register map the gateware and its decoder use."""

import re

from ina_fabric.protocol import counters as C


def test_the_generated_c_header_is_up_to_date():
    """``python -m ina_fabric.protocol.counters`` regenerates it after a table change."""
    assert C.C_HEADER_PATH.read_text() == C.c_header(), \
        "ina_counters.h is stale: run `python -m ina_fabric.protocol.counters`"


def test_the_c_engine_writes_no_counter_name_by_hand():
    src = (C.C_HEADER_PATH.parent.parent.parent / "host/switch/_engine.c").read_text()
    assert '#include "ina_counters.h"' in src
    assert not re.search(r"COUNTER_NAMES\s*\[[^]]*\]\s*=", src)
    for name in C.ENGINE_COUNTERS:
        assert f'"{name}"' not in src, name


def test_the_running_engine_reports_exactly_its_table_counters():
    from ina_fabric.host.switch.fast import FastSwitchModel
    m = FastSwitchModel()
    try:
        assert tuple(m.engine.counters()) == C.ENGINE_COUNTERS
    finally:
        getattr(m, "close", lambda: None)()


def test_the_model_and_the_register_map_take_the_table():
    from ina_fabric.host.switch.model import COUNTERS, ANSWER_COUNTERS, SwitchModel
    from ina_fabric.protocol.regs import COUNTER_NAMES, counter_addr, COUNTER_BASE
    assert COUNTERS == C.MODEL_COUNTERS and ANSWER_COUNTERS == C.ANSWER_COUNTERS
    assert set(SwitchModel().counters) == set(C.MODEL_COUNTERS)
    assert COUNTER_NAMES == C.GATEWARE_COUNTERS
    for d in C.TABLE:
        if d.register is not None:
            assert counter_addr(d.name) == COUNTER_BASE + d.register, d.name


def test_every_counter_has_its_meaning():
    assert all(d.doc and d.kept_by for d in C.TABLE)
    assert set(C.DOCS) >= set(C.MODEL_COUNTERS) | set(C.ENGINE_COUNTERS) | \
        set(C.GATEWARE_COUNTERS)
