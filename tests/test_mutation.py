"""Mutation harness (opt-in: ``INA_MUTATION=1``): realistic bugs planted in a copy of
hw/ina's source, one at a time; each must be killed by the suite (the block tests and
proofs of tests/test_hw_ina_blocks.py first, then the cocotb benches of the mutated
module's own blocks (tests/test_sim_blocks.py, seconds each), then the core's benches:
directed L = 8 and L = 1, coverage L = 4 and L = 1). Prints what killed each mutant and
after how many seconds.

Each mutant runs in its own process: the mutated module's source is executed over the
imported module, and the modules that import from it are reloaded, so the core built
in that process is the mutant (the cocotb side imports only layouts and constants).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [
              pytest.mark.skipif(not os.environ.get("INA_MUTATION"),
                                 reason="opt-in: INA_MUTATION=1")]

#: (name, module, old, new): each a bug a reviewer could plant or a designer could make
MUTANTS = [
    ("expiry one cycle late", "slot", "return ~(ts - due)[31]", "return ~(ts - due - 1)[31]"),
    ("expiry one cycle early", "slot", "return ~(ts - due)[31]", "return ~(ts - due + 1)[31]"),
    ("non-modular seq compare", "slot", "return ~(tag[:32] - seq[:32])[31]",
     "return seq[:32] <= tag[:32]"),
    ("reuse compare on 34 bits", "slot", "eq_chain(mdx.tag[:32], op.seqm[:32])",
     "eq_chain(mdx.tag, op.seqm)"),
    ("set bit from the wrong seq bit", "slot", "wset = (seq_low & wbit[:lwm + 1]).any()",
     "wset = (seq_low & (wbit << 1)[:lwm + 1]).any()"),
    ("checksum folds the carry once", "replicator", "s2 = s1[0:16] + s1[16:]", "s2 = s1"),
    ("saturation off by one", "replicator", "hi = v >= (1 << 31)", "hi = v > (1 << 31)"),
    ("no forwarding of the last write", "element",
     "e1_f1.eq(e2_valid & (e2_addr == s1_addr))", "e1_f1.eq(0)"),
    ("late counter not raised", "slot_effects", 'inc["late"].append(resend & ~isdup)',
     'inc["late"].append(C(0))'),
    ("duplicate on an open slot not counted", "slot_effects",
     'inc["duplicates"] += [resend & isdup, v2 & dup_only]',
     'inc["duplicates"] += [resend & isdup, C(0)]'),
    ("scanner skips the last record", "slot_issue",
     "scan_ptr.eq(Mux(scan_ptr == R - 1, 0, scan_ptr + 1))",
     "scan_ptr.eq(Mux(scan_ptr >= R - 2, 0, scan_ptr + 1))"),
    ("scanner uses the current time", "header_pop",
     "horizon = Mux(collecting, ts_reg, Mux(avail, b.ts, now))", "horizon = now"),
    ("re-run skips the source check", "slot_compare",
     "src_ok1 = Mux(p1_reinj, p1_op.src_ok, Array(p1_src_eq)[p1_job].all())",
     "src_ok1 = p1_reinj | Array(p1_src_eq)[p1_job].all()"),
    ("reuse not deferred while the result is sent", "slot_rules",
     "k_defer1 = k_reuse1 & q1m.nelem_nz & (k_expire1 | q1m.pend)",
     "k_defer1 = k_reuse1 & q1m.nelem_nz & k_expire1"),
    ("completion at count == N (one late)", "slot", '"cnt1_n": mdx.count == nm1,',
     '"cnt1_n": mdx.count == nm1 + 1,'),
    ("unicast copies one short", "replicator",
     'Mux(one0, 0, jf("nworkers", nxt0.job) - 1)', 'Mux(one0, 0, jf("nworkers", nxt0.job) - 2)'),
    ("larger exponent compare inverted", "slot_rules",
     "(q1_op.exp > q1_mdx.exponent)", "(q1_op.exp < q1_mdx.exponent)"),
    ("overflow bit of the last beat only", "element",
     "ovf_now = Mux(e2_first, beat_ovf, ovf_run | beat_ovf)", "ovf_now = beat_ovf"),
]
PLANTED = ["wrapping_adder", "no_duplicate_check"]

_RUNNER = textwrap.dedent('''
    import importlib, json, sys, dataclasses
    spec = json.loads(sys.argv[1])
    import ina_fabric.hw.ina as pkg
    # each mutated module's (or planted bug's) blocks, whose own benches run first
    # (the stages' benches first, then the header pipeline's, the six stages joined)
    BLOCKS = {"slot": ("SlotCompare", "SlotRules", "HeaderPop", "HeaderPipeline"),
              "header_pop": ("HeaderPop", "HeaderPipeline"),
              "slot_issue": ("SlotIssue", "HeaderPipeline"),
              "slot_compare": ("SlotCompare", "HeaderPipeline"),
              "slot_rules": ("SlotRules", "HeaderPipeline"),
              "slot_effects": ("SlotEffects", "HeaderPipeline"), "element": ("ElementPath",),
              "replicator": ("Replicator",), "wrapping_adder": ("ElementPath",),
              "no_duplicate_check": ("SlotRules", "HeaderPipeline")}
    # every module that imports from a mutated one, in import order (hw/ina/*.py)
    DEPENDENTS = ("slot", "element", "header_pop", "header_decode", "slot_issue",
                  "slot_compare", "slot_rules", "slot_effects", "header", "replicator",
                  "core")
    bug = spec.get("planted")
    if spec.get("module"):
        name = "ina_fabric.hw.ina." + spec["module"]
        mod = importlib.import_module(name)
        src = open(mod.__file__).read()
        assert src.count(spec["old"]) == 1, "mutation site not found once: " + spec["old"]
        src = src.replace(spec["old"], spec["new"])
        exec(compile(src, mod.__file__, "exec"), mod.__dict__)
        for dep in DEPENDENTS:
            if dep != spec["module"]:
                importlib.reload(importlib.import_module("ina_fabric.hw.ina." + dep))
    import pytest, time
    t0 = time.time()
    def killed(by):
        print(f"KILLED by {by} after {time.time() - t0:.0f} s"); sys.exit(0)
    # 1. block tests and proofs, on the mutated modules (in this process)
    if pytest.main(["-q", "-x", "-p", "no:cacheprovider", "tests/test_hw_ina_blocks.py"]) != 0:
        killed("tests/test_hw_ina_blocks.py")
    # 2. the cocotb benches of the blocks the mutated module holds (seconds each)
    sys.path.insert(0, "tests")
    from test_sim_blocks import bench_of, run_block
    for name in BLOCKS.get(spec.get("module") or bug, ()):
        n, make, module, options = bench_of(name)
        if bug:
            options["planted"] = bug
        try:
            run_block(n, make, module, options, tag="mut_" + spec["tag"] + "_")
        except AssertionError:
            killed("the " + name + " bench")
    from ina_fabric.hw.ina.core import InaCore
    from ina_fabric.sim.common import run_cocotb
    sys.path.insert(0, "tests")
    from test_sim_ina_core import P_L1, P_L8
    from test_sim_ina_coverage import COV_CONFIGS, run_coverage
    tag = spec["tag"]
    benches = [("directed L8", lambda: run_cocotb(InaCore(P_L8, planted_bug=bug), toplevel="ina_core",
                    test_module="ina_fabric.sim.ina.tb_core", name=f"mut_{tag}_d8",
                    testcase=["test_directed", "test_back_to_back"],
                    env={"INA_PARAMS": json.dumps(dataclasses.asdict(P_L8))})),
               ("coverage L4", lambda: run_coverage(COV_CONFIGS[4], f"mut_{tag}_c4",
                    core=InaCore(COV_CONFIGS[4], planted_bug=bug), INA_SIM_SEEDS=1)),
               ("directed L1", lambda: run_cocotb(InaCore(P_L1, planted_bug=bug), toplevel="ina_core",
                    test_module="ina_fabric.sim.ina.tb_core", name=f"mut_{tag}_d1",
                    testcase=["test_directed", "test_back_to_back"],
                    env={"INA_PARAMS": json.dumps(dataclasses.asdict(P_L1))})),
               ("coverage L1", lambda: run_coverage(COV_CONFIGS[1], f"mut_{tag}_c1",
                    core=InaCore(COV_CONFIGS[1], planted_bug=bug)))]
    for what, run in benches:
        try:
            cov = run()
            if isinstance(cov, dict) and [n for n in cov["required"] if not cov["hits"].get(n)]:
                raise AssertionError("coverage holes")
        except AssertionError as e:
            killed(what)
    print("SURVIVED"); sys.exit(0)
''')


def _run_mutant(spec):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(spec)], cwd=root,
                       capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("KILLED", "SURVIVED"))]
    return lines[-1] if lines else f"ERROR rc={r.returncode}: {r.stderr[-2000:]}"


@pytest.mark.parametrize("mutant", MUTANTS + [(p, None, None, None) for p in PLANTED],
                         ids=[m[0].replace(" ", "_") for m in MUTANTS] + PLANTED)
def test_mutant_is_killed(mutant):
    name, module, old, new = mutant
    tag = "".join(c if c.isalnum() else "_" for c in name)[:40]
    spec = ({"planted": name, "tag": tag} if module is None else
            {"module": module, "old": old, "new": new, "tag": tag})
    verdict = _run_mutant(spec)
    print(f"mutant {name!r}: {verdict}")
    assert verdict.startswith("KILLED"), f"mutant {name!r}: {verdict}"
