"""Bench of :class:`~ina_fabric.hw.ina.slot_effects.SlotEffects` (P2, P3): random
operations and rules (idle cycles: no valid operation; re-runs), the metadata write,
both requests and their record (registered: a cycle later), the counter events, the
element path's packet and the re-run's wait against :func:`~.stage_model.effects_py`."""

import cocotb
from amaranth.lib import data

from ina_fabric.hw.ina.element import packet_layout
from ina_fabric.hw.ina.layout import request_layout
from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.hw.ina.leaf import LEAF_RULES
from ina_fabric.hw.ina.slot import (HEADER_EVENTS, RULE_FIELDS, meta_layout, op_layout,
                                    stage_layout, write_layout)
from ina_fabric.sim.bench import Bench, bench_params, fields, pack, unpack
from ina_fabric.sim.ina.stage_model import effects_py
from ina_fabric.sim.ina.tb_slot_rules import rand_meta, rand_op


@cocotb.test()
async def test_slot_effects(dut):
    p = bench_params()
    P = CoreParams(**p["core"])
    b = Bench(dut, seed=p["seed"])
    ST, ML, OL, WL = stage_layout(P), meta_layout(P), op_layout(P), write_layout(P)
    RL = data.StructLayout({k: 1 for k in RULE_FIELDS})
    QL, EL, PL = request_layout(P), data.StructLayout(HEADER_EVENTS), packet_layout(P)
    await b.reset(**dict.fromkeys(("p2", "c", "p2_md", "p2_bit", "p2_cnt1", "p2_due",
                                   "p2_init_tag", "p2_job", "reinject"), 0))
    prev, retry = None, 0
    width = {n: w for n, _, w in fields(ML)}
    for cyc in range(p["n"]):
        op = rand_op(b.rng, P)
        md = rand_meta(b.rng, P, op["seq"] if b.rng.random() < 0.5 else None)
        c = {k: b.rng.getrandbits(1) for k in RULE_FIELDS}
        if not P.leaf:  # (a leaf's rules are constant 0 in a core without the option)
            c |= dict.fromkeys(LEAF_RULES, 0)
        ins = {"valid": int(b.rng.random() >= p["idle"]), "reinj": b.rng.getrandbits(1),
               "adj": int(b.rng.random() < 0.2)}
        x = {"p2_bit": 1 << op["worker"], "p2_cnt1": md["count"] + 1,
             "p2_due": b.rng.getrandbits(32), "p2_init_tag": b.rng.getrandbits(34),
             "p2_job": b.rng.randrange(P.jobs), "reinject": int(b.rng.random() < 0.1)}
        b.wr("p2", {**ins, "op": pack(OL, op)}, ST)
        b.wr("c", c, RL), b.wr("p2_md", md, ML)
        for k, v in x.items():
            b.wr(k, v)
        v2 = int(ins["valid"] and not ins["adj"])
        want = effects_py(P, v2, op, c, md, x["p2_bit"], x["p2_cnt1"], x["p2_due"],
                          x["p2_init_tag"], x["p2_job"])
        await b.settle()
        # the combinational outputs, for this cycle's inputs
        assert b.rd("v2") == v2
        assert b.rd("events", EL) == want["events"], f"cycle {cyc}: events"
        assert b.rd("accepted") == want["accepted"], f"cycle {cyc}: accepted"
        assert b.rd("elem_start") == want["elem_start"], f"cycle {cyc}: elem_start"
        pk = b.rd("elem_packet", PL)
        assert (pk["rec"], pk["nelem"], pk["mode"]) == (op["rec"], op["nelem"], want["mode"])
        assert b.rd("rewind_to") == op["rewind"]
        await b.step()
        # the registers (P3), for the previous cycle's inputs
        if prev is not None:
            w3 = b.rd("w3", WL)
            exp = prev["w3"]
            assert (w3["en"], w3["addr"]) == (exp["en"], exp["addr"]), f"cycle {cyc}: w3"
            if exp["en"]:
                got = unpack(ML, w3["data"])
                want_d = {k: v & ((1 << width[k]) - 1) for k, v in exp["data"].items()}
                assert got == want_d, f"cycle {cyc}: write {got} != {want_d}"
            assert b.rd("push_a") == prev["push_a"] and b.rd("push_b") == prev["push_b"]
            if prev["push_a"]:
                assert b.rd("a", QL) == prev["a"], f"cycle {cyc}: request a"
            if prev["push_b"]:
                assert b.rd("b", QL) == prev["b"], f"cycle {cyc}: request b"
            assert b.rd("push_hot") == 1 << prev["rec"]
            assert b.rd("retry") == retry, f"cycle {cyc}: retry"
        # retry: set by a re-run, cleared when the re-run operation reaches P2
        if x["reinject"]:
            retry_next = 1
        elif ins["valid"] and ins["reinj"]:
            retry_next = 0
        else:
            retry_next = retry
        retry = retry_next
        prev = {**want, "rec": op["rec"]}
