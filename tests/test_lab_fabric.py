"""The `fabric` lab: racks of hosts under top-of-rack switches, oversubscribed uplinks to a
spine. The plan (addresses, names, uplink rates, routes, bad parameters) needs nothing;
the lab tests bring a 2 x 2 fabric up, check that the racks reach each other and the
spine only through the shaped uplinks, run one allreduce through a single switch at the
spine and one through the tree (ToRs under the spine, where this checkout has it), check
every rank's bytes, and tear down. Skipped where labs cannot be built; about 20 s."""

import ipaddress
import json
import os
import sys

import pytest

from ina_fabric.host.lab import Lab, TopologyError, available, load, list_labs
from ina_fabric.host.lab import fabric as F
from ina_fabric.host.lab import netns as N
from ina_fabric.host.lab.topology import LAB_NET, from_dict

WHY = available()


def needs_lab(fn):
    fn = pytest.mark.skipif(WHY is not None, reason=f"ina lab: {WHY}")(fn)
    return pytest.mark.xdist_group("lab")(fn)


# -- the plan (no root needed) ---------------------------------------------------------

def test_fabric_defaults_four_racks_of_four_at_four_to_one():
    t = load("fabric")
    assert (len(t.racks), len(t.hosts), t.spine) == (4, 16, "sp")
    assert [h.name for h in t.hosts[:5]] == ["r0h0", "r0h1", "r0h2", "r0h3", "r1h0"]
    assert t.rack_hosts("t2") == ["r2h0", "r2h1", "r2h2", "r2h3"]
    # 4 hosts at the host rate over one uplink: 4:1, the uplink at the host rate
    assert t.oversubscription == 4.0
    assert all(w.link.rate == t.hosts[0].link.rate for w in t.wan)
    assert [(w.a, w.b) for w in t.wan] == [(f"t{k}", "sp") for k in range(4)]
    every = [h.address for h in t.hosts] + [s.address for s in t.switches] + \
        [a for w in t.wan for a in w.addresses]
    assert len(set(every)) == len(every) and all(a in LAB_NET for a in every)
    assert len(set(t.nodes)) == len(t.nodes)
    # racks reach each other through the spine; the spine reaches each rack directly
    assert t.routes["t0"] == {"t1": "sp", "t2": "sp", "t3": "sp", "sp": "sp"}
    assert t.routes["sp"] == {f"t{k}": f"t{k}" for k in range(4)}


def test_fabric_uplink_rate_follows_the_oversubscription():
    t = load("fabric", {"racks": 2, "hosts_per_rack": 2, "rate": "100mbit"})
    assert [w.link.rate for w in t.wan] == [50_000_000] * 2 and t.oversubscription == 4
    t = load("fabric", {"racks": 2, "hosts_per_rack": 4, "rate": "100mbit",
                        "oversubscription": 1})
    assert t.wan[0].link.rate == 400_000_000 and t.oversubscription == 1
    t = load("fabric", {"racks": 3, "hosts_per_rack": 4, "rate": "100mbit",
                        "uplink_rate": "200mbit"})
    assert t.wan[0].link.rate == 200_000_000 and t.oversubscription == 2
    assert F.rack_of(t, "198.18.2.3") == "t2"
    with pytest.raises(ValueError, match="none of the racks"):
        F.rack_of(t, "198.18.7.1")


@pytest.mark.parametrize("sets,match", [
    ({"racks": 0}, "racks 0 outside"), ({"racks": 33}, "racks 33 outside"),
    ({"hosts_per_rack": 17}, "hosts per rack 17 outside"),
    ({"oversubscription": 0}, "oversubscription 0.0 must be positive"),
    ({"hosts": 4}, "unknown parameter 'hosts'"),
])
def test_fabric_bad_parameters_say_which(sets, match):
    with pytest.raises(TopologyError, match=match):
        load("fabric", sets)


def test_fabric_refuses_addresses_outside_the_benchmark_range():
    doc = {"name": "f", "fabric": {"racks": 2, "hosts": 2, "subnet": "10.0.0.0/16",
                                   "host_rate": "1gbit"}}
    with pytest.raises(TopologyError, match="outside 198.18.0.0/15"):
        from_dict(doc, {})


def test_a_static_tree_leaf_is_not_refused_for_holding_a_share_of_the_workers(monkeypatch):
    """A rank of a static tree job asks its own leaf where the run starts; the leaf
    holds its rack's members (2), the run has the whole fabric's workers (4). Before the
    fix, static_position refused it as "another number of members"."""
    from ina_fabric.protocol import control_client
    from ina_fabric.host.transport.switch_client import SwitchRefused, static_position
    leaf = {"workers": 2, "session": f"{7:016x}", "position": 0, "open_slots": 0,
            "parent": "198.18.255.254:19900", "index": 0, "members_are": "workers",
            "total_workers": 2}
    monkeypatch.setattr(control_client, "query_status",
                        lambda *a, **k: {"jobs": {"1": leaf}})
    assert static_position(("198.18.0.254", 19900), 1, 7, workers=4) == 0
    one = {k: v for k, v in leaf.items() if k not in ("parent", "index", "members_are",
                                                      "total_workers")}
    monkeypatch.setattr(control_client, "query_status",
                        lambda *a, **k: {"jobs": {"1": one}})
    with pytest.raises(SwitchRefused, match="2 member"):
        static_position(("198.18.0.254", 19900), 1, 7, workers=4)


def test_lab_up_fabric_flags_in_help():
    import subprocess
    r = subprocess.run([sys.executable, "-m", "ina_fabric.host.cli", "lab", "up", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    for flag in ("--racks", "--hosts-per-rack", "--oversubscription"):
        assert flag in r.stdout


@needs_lab
def test_lab_up_fabric_refuses_the_board_engine_before_building_anything():
    import subprocess
    lab_id = f"fb{os.getpid() % 100000}"[:8]
    r = subprocess.run([sys.executable, "-m", "ina_fabric.host.cli", "lab", "up", "fabric",
                        "--racks", "2", "--hosts-per-rack", "2", "--switch", "board",
                        "--id", lab_id], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "fast, model or rtl" in r.stderr, r.stderr
    assert lab_id not in list_labs() and not N.lab_namespaces(lab_id)


# -- the lab ---------------------------------------------------------------------------

WORKER = r"""
import hashlib, json, sys
import numpy as np
from ina_fabric.host.transport.switch_client import SwitchClient
switch, job, worker, world, rank, session, bind, n = json.loads(sys.argv[1])
x = (np.arange(n, dtype=np.float32) % 97) * (rank + 1)
c = SwitchClient(tuple(switch), job, worker, world, window=8, elements=256,
                 bind=tuple(bind), session=session, connect_timeout=10.0)
z, _ = c.allreduce(x)
want = (np.arange(n, dtype=np.float32) % 97) * (world * (world + 1) // 2)
print(json.dumps({"digest": hashlib.sha256(z.tobytes()).hexdigest(),
                  "exact": bool(np.array_equal(z, want))}))
"""


def _allreduce(lab, kind, job, n=4096, session=0x5EED38B):
    """Install job ``job`` as ``kind`` (from inside the lab), run one allreduce on every
    host (worker port 20000, ranks in host order: rack by rack), remove the job; per rank
    (digest, exact)."""
    import subprocess
    from ina_fabric.protocol.jobtable import job_defaults
    members = [f"{lab.address(h)}:20000" for h in lab.hosts]
    roles = F.install_in_lab(lab, kind, job, job_defaults("ethernet", window=8,
                                                          elements=256), session, members)
    procs = []
    for rank, (h, role) in enumerate(zip(lab.hosts, roles)):
        ip, _, port = role["switch"].rpartition(":")
        arg = [[ip, int(port)], job, role["worker"], role["nworkers"], rank, session,
               [lab.address(h), 20000], n]
        procs.append(lab.popen(h, [sys.executable, "-c", WORKER, json.dumps(arg)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, e[-2000:]
    F.remove_in_lab(lab, kind, job, session, members)
    return [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]


@pytest.fixture(scope="module")
def fabric_lab():
    """A 2 x 2 fabric at 100 Mbit (4:1: uplinks at 50 Mbit) with its switches (a tree
    where this checkout has one), for the module; removed afterwards, leaving nothing."""
    if WHY is not None:
        pytest.skip(f"ina lab: {WHY}")
    topo = load("fabric", {"racks": 2, "hosts_per_rack": 2, "rate": "100mbit"})
    lab_id = f"fab{os.getpid() % 100000}"[:8]
    lab = Lab(topo, lab_id).up()
    try:
        lab.switches = lab.start_fabric(tree=True)
        yield lab
    finally:
        lab.down()
    assert lab_id not in list_labs() and not N.lab_namespaces(lab_id)
    assert not any(n.startswith("w") and n[1:2] in ("t", "s") for n in os.listdir("/sys/class/net"))


@needs_lab
def test_fabric_lab_routes_through_shaped_uplinks(fabric_lab):
    from ina_fabric.host.lab import probe
    lab = fabric_lab
    for dst in ("r1h1", "sp", "t1"):               # another rack, the spine, its switch
        r = probe.rtt(lab, "r0h0", dst, count=5, interval_ms=2.0)
        assert r["lost"] == 0, dst
    with N.ipr(lab.ns("t0")) as ip:                # rack 0's uplink: tbf at 50 Mbit
        assert N.qdisc_stats(ip, "wsp")["kind"] == "tbf"
    with N.ipr(lab.ns("sp")) as ip:
        routes = {str(ipaddress.ip_network(f"{r.get_attr('RTA_DST')}/{r['dst_len']}"))
                  for r in ip.get_routes(family=2) if r.get_attr("RTA_DST")}
    assert {"198.18.0.0/24", "198.18.1.0/24"} <= routes
    # a flow between racks gets the uplink's rate, not the host link's
    mbit = probe.tcp_throughput(lab, "r0h0", "r1h0", seconds=1.5) / 1e6
    assert 35 < mbit < 52, mbit


@needs_lab
def test_one_allreduce_through_a_single_switch_at_the_spine(fabric_lab):
    switches = fabric_lab.switches
    assert [s[0] for s in switches] == ["198.18.255.254", "198.18.0.254", "198.18.1.254"]
    got = _allreduce(fabric_lab, "flat", 1)
    assert all(r["exact"] for r in got) and len({r["digest"] for r in got}) == 1


@needs_lab
def test_one_allreduce_through_the_tree(fabric_lab):
    got = _allreduce(fabric_lab, "tree", 2, session=0x5EED38C)
    assert all(r["exact"] for r in got) and len({r["digest"] for r in got}) == 1


@needs_lab
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("INA_FABRIC_BENCH"),
                    reason="`ina bench fabric --quick` end to end (about 90 s on 2 cores): "
                           "set INA_FABRIC_BENCH=1")
def test_fabric_bench_quick_writes_checked_rows(lab_bench, tmp_path):
    from ina_fabric.bench import bench_fabric as B
    rc = B.main(["--quick", "--shapes", "1x2,2x2", "--straggler-ms", "20",
                 "--straggler-calls", "3", "--id", lab_bench("fb")])
    assert rc == 0
    rows = json.loads((tmp_path / "fabric.json").read_text())["figures"]["rows"]
    assert [(r["hosts"], r["racks"]) for r in rows] == [(2, 1), (4, 2)]
    for r in rows:
        for key in ("oversubscription", "rate_mbit", "tree_s", "flat_s", "gloo_s",
                    "gloo_over_tree", "flat_over_tree", "tree_over_one_rack", "checked"):
            assert r[key] is not None, key
        assert r["checked"] and r["oversubscription"] == 4 and r["rate_mbit"] == 100
        assert r["straggler"]["tree"]["identical"]
    assert rows[0]["tree_over_one_rack"] == 1.0


@needs_lab
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("INA_FABRIC_BENCH"),
                    reason="`ina train --lab fabric` end to end (about 3 min on 2 cores): "
                           "set INA_FABRIC_BENCH=1")
def test_train_on_the_fabric_tree(tmp_path, lab_bench):
    """2 racks x 2: the ina backend through the tree (a static tree job, each rank at its
    rack's switch) reaches the target with identical replicas; no lab left."""
    import subprocess
    r = subprocess.run([sys.executable, "-m", "ina_fabric.host.cli", "train", "--lab",
                        "fabric", "--workers", "4", "--lab-set", "hosts_per_rack=2",
                        "--lab-set", "rate=100mbit", "--backends", "ina", "--no-progress",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())["ina"]
    assert res["time_to_accuracy"] is not None and res["fallbacks"] == 0
    assert len(set(res["param_hashes"])) == 1
    assert res["config"]["static_job"]
    assert "train" not in list_labs()


@needs_lab
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("INA_FABRIC_BENCH"),
                    reason="DDP on the `ina` backend through the fabric's tree (about 2 min "
                           "on 2 cores): set INA_FABRIC_BENCH=1")
def test_ina_backend_trains_through_the_fabric_tree(fabric_lab):
    """2 racks x 2: ``init_process_group("ina")`` on every host, each rank a member of
    its rack's switch (a static tree job installed from inside the lab); DDP on the digits
    CNN reaches the target test accuracy, through the switch, with identical replicas."""
    import subprocess
    from pathlib import Path
    from ina_fabric.protocol.jobtable import job_defaults
    lab, job, session, base = fabric_lab, 7, 0x5EED38BB, 21000
    members = [f"{lab.address(h)}:{base + r}" for r, h in enumerate(lab.hosts)]
    settings = job_defaults("ethernet", elements=2048)
    roles = F.install_in_lab(lab, "tree", job, settings, session, members)
    script = str(Path(__file__).with_name("fabric_backend_rank.py"))
    procs = []
    for rank, (h, role) in enumerate(zip(lab.hosts, roles)):
        env = {**os.environ, "MASTER_ADDR": lab.address(lab.hosts[0]), "MASTER_PORT": "29438",
               "RANK": str(rank), "WORLD_SIZE": str(len(lab.hosts)),
               "GLOO_SOCKET_IFNAME": "eth0", "INA_SWITCH": role["switch"],
               "INA_WORKER": str(role["worker"]), "INA_JOB": str(job), "INA_STATIC_JOB": "1",
               "INA_SESSION": hex(session), "INA_PORT": str(base), "INA_ELEMENTS": "2048",
               "INA_WINDOW": str(settings.window)}
        procs.append(lab.popen(h, [sys.executable, script], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        F.remove_in_lab(lab, "tree", job, session, members)
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, e[-3000:]
    got = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    assert all(r["use_switch"] and r["switch_calls"] > 0 for r in got), got
    assert all(r["acc"] >= r["target"] for r in got), got
    assert len({r["digest"] for r in got}) == 1 and len({r["epoch"] for r in got}) == 1
    print(f"ina backend on the 2x2 fabric tree: target {got[0]['target']} reached at "
          f"epoch {got[0]['epoch']} (test accuracy {got[0]['acc']:.3f}), "
          f"{got[0]['switch_calls']} switch calls per rank, replicas identical")


def _rtl_why_not():
    from ina_fabric.host.switch.rtl import why_not
    return why_not()


@needs_lab
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(not os.environ.get("INA_SIM_FULL"),
                    reason="long tier (the gateware in Verilator as every switch; two core "
                           "builds the first time, minutes on 2 cores): INA_SIM_FULL=1")
def test_lab_up_fabric_with_rtl_switches_runs_the_tree_through_the_gateware():
    """`ina lab up fabric --switch rtl`, 2 racks x 2: the spine's `ina switch --engine
    rtl` simulates the core built with the tree option, each top-of-rack switch's the core
    with the tree and leaf options. A reliable allreduce from every host through the tree:
    every rank gets the exact sum, the same bytes; every switch's core took datagrams and
    its live scoreboard (the model beside it) never disagreed; `ina lab down` leaves
    nothing."""
    import subprocess
    why = _rtl_why_not()
    if why:
        pytest.skip(f"--engine rtl: {why}")
    lab_id = f"fr{os.getpid() % 100000}"[:8]
    cli = [sys.executable, "-m", "ina_fabric.host.cli", "lab"]
    up = subprocess.run(cli + ["up", "fabric", "--racks", "2", "--hosts-per-rack", "2",
                               "--rate", "100mbit", "--switch", "rtl", "--id", lab_id],
                        capture_output=True, text=True, timeout=1500)
    try:
        assert up.returncode == 0, up.stdout + up.stderr[-3000:]
        assert up.stdout.count("ina switch on") == 3, up.stdout
        lab = Lab.attach(lab_id)
        got = _allreduce(lab, "tree", 3, session=0x5EED38D)
        assert all(r["exact"] for r in got) and len({r["digest"] for r in got}) == 1, got
        probe = ("import json; from ina_fabric.protocol.control_client import query_status "
                 "as q; print(json.dumps(q(('%s', %d), timeout=5.0)['rtl']))")
        for node, (ip, port) in zip(["sp", "t0", "t1"], [("198.18.255.254", 19900),
                                                         ("198.18.0.254", 19900),
                                                         ("198.18.1.254", 19900)]):
            r = lab.run(node, [sys.executable, "-c", probe % (ip, port)], timeout=60)
            assert r.returncode == 0, r.stderr[-2000:]
            rtl = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"{node}: the core took {rtl['datagrams_in']} datagrams, sent "
                  f"{rtl['datagrams_out']}, {rtl['disagreements']} disagreements")
            assert rtl["datagrams_in"] > 0 and rtl["disagreements"] == 0, (node, rtl)
    finally:
        down = subprocess.run(cli + ["down", "--id", lab_id], capture_output=True,
                              text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert lab_id not in list_labs() and not N.lab_namespaces(lab_id)
