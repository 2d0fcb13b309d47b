"""`ina lab`: topologies, links that come up and carry their rate, the delay line, and a
teardown that leaves nothing behind (no namespace, no link, no process), also after a
crash; two labs side by side. Tests that build labs need root, namespaces and TUN; they
skip with the reason elsewhere. Each lab is small (2..3 hosts) and each flow bounded
(2 s), so the file takes well under a minute."""

import itertools
import os
import pathlib
import subprocess
import sys
import time

import pytest

from ina_fabric.host.lab import Lab, LabError, TopologyError, available, load, parse_rate
from ina_fabric.host.lab import netns as N
from ina_fabric.host.lab import probe
from ina_fabric.host.lab.lab import STATE_DIR, down

WHY = available()


def needs_lab(fn):
    """Builds labs: root, namespaces, TUN (else skipped, saying which); one xdist group,
    so two workers never shape links at the same time on a 2-core machine."""
    fn = pytest.mark.skipif(WHY is not None, reason=f"ina lab: {WHY}")(fn)
    return pytest.mark.xdist_group("lab")(fn)

_ids = itertools.count()


def lab_id() -> str:
    """A fresh id per lab, unique across test processes (names are what `down` finds)."""
    return f"t{os.getpid() % 100000}{next(_ids)}"[:8]


def root_links() -> set[str]:
    return set(os.listdir("/sys/class/net"))


# -- topologies (no root needed) -----------------------------------------------------

def test_rack_defaults_and_parameters():
    t = load("rack")
    assert [h.name for h in t.hosts] == ["h0", "h1", "h2", "h3"]
    assert {h.link.rate for h in t.hosts} == {10**9}
    assert str(t.switch().address) == "198.18.0.254"
    assert [str(h.address) for h in t.hosts] == [f"198.18.0.{i}" for i in range(1, 5)]
    t = load("rack", {"hosts": "16", "rate": "100mbit", "delay_ms": "5"})
    assert len(t.hosts) == 16 and t.hosts[0].link.rate == 10**8
    assert t.hosts[0].link.impaired and t.hosts[0].link.delay_ms == 5.0
    with pytest.raises(TopologyError, match="1..16"):
        load("rack", {"hosts": 17})
    with pytest.raises(TopologyError, match="unknown parameter"):
        load("rack", {"nodes": 3})


def test_addresses_stay_in_the_benchmark_range(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('[[switch]]\nname = "sw"\nsubnet = "10.0.0.0/24"\n'
                 '[[hosts]]\nprefix = "h"\nswitch = "sw"\nrate = "1gbit"\n')
    with pytest.raises(TopologyError, match="outside 198.18.0.0/15"):
        load(p)


@pytest.mark.parametrize("text,bits", [("1gbit", 10**9), ("100mbit", 10**8),
                                       ("500kbit", 5 * 10**5), ("2.5Gbit", 25 * 10**8),
                                       ("1e6", 10**6)])
def test_rates_are_decimal_bits(text, bits):
    assert parse_rate(text) == bits


def test_lab_verb_help_runs_nothing():
    r = subprocess.run([sys.executable, "-m", "ina_fabric.host.cli", "lab", "up", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--rate" in r.stdout


# -- labs (root) ---------------------------------------------------------------------

def _rtt_ok(lab, a, b, count=5):
    r = probe.rtt(lab, a, b, count=count, interval_ms=2)
    assert r["lost"] == 0, (a, b, r)
    return r


def _nothing_left(lab_id, links_before, pids=()):
    assert N.lab_namespaces(lab_id) == []
    assert root_links() == links_before, "links appeared or vanished in the host namespace"
    assert not (STATE_DIR / lab_id).exists()
    for pid in pids:
        assert not pathlib.Path(f"/proc/{pid}").exists() or \
            pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", pid


@needs_lab
def test_links_up_and_hosts_reach_each_other_through_the_bridge():
    with Lab(load("rack", {"hosts": 3}), lab_id()) as lab:
        for a, b in (("h0", "h1"), ("h1", "h2"), ("h2", "h0"), ("h0", "sw")):
            _rtt_ok(lab, a, b)
        with N.ipr(lab.ns("sw")) as ip:       # the hosts' links are ports of br0
            br = ip.link_lookup(ifname="br0")[0]
            ports = {ln.get_attr("IFLA_IFNAME") for ln in ip.get_links()
                     if ln.get_attr("IFLA_MASTER") == br}
            assert ports == {"h0", "h1", "h2"}
            assert N.qdisc_stats(ip, "h0")["kind"] == "tbf"


@needs_lab
@pytest.mark.parametrize("rate", ["100mbit", "1gbit"])
def test_link_rate_holds(rate):
    """One TCP flow h0 -> h1 for 2 s: within 10% of R, never above it. (At MTU 1500 TCP
    carries at most 1448/1514 = 95.6% of the line rate, so the flow sits near 0.95 R.)
    At 1 Gbit the flow needs most of a core; while the other test worker (or anyone on
    this shared machine) is busy it can fall short for CPU, not for the link, so up to
    three flows are measured and the best counts (all are printed, all must stay <= R)."""
    r = parse_rate(rate)
    runs = []
    with Lab(load("rack", {"hosts": 2, "rate": rate}), lab_id()) as lab:
        for _ in range(3):
            runs.append(probe.tcp_throughput(lab, "h0", "h1", seconds=2.0))
            if runs[-1] >= 0.9 * r:
                break
    print(f"{rate}: TCP " + ", ".join(f"{b / 1e6:.1f} Mbit/s = {b / r:.3f} R" for b in runs))
    assert all(b <= 1.0 * r for b in runs)
    assert max(runs) >= 0.9 * r, f"{rate}: best {max(runs) / 1e6:.1f} Mbit/s"


@needs_lab
def test_teardown_leaves_nothing_behind():
    before = root_links()
    i = lab_id()
    lab = Lab(load("rack", {"hosts": 2, "delay_ms": 1}), i).up()   # a delay line too
    try:
        lab.start_switch()
        sleeper = lab.popen("h1", ["sleep", "30"])
        pids = [sleeper.pid] + [s["pid"] for s in lab.services.values()]
        assert len(pids) == 4            # sleep, 2 delay lines, the switch
        assert root_links() == before    # nothing of the lab in the host namespace
    finally:
        lab.down()
    sleeper.wait(5)
    _nothing_left(i, before, pids)


@needs_lab
def test_a_failed_build_removes_what_it_made(monkeypatch):
    before = root_links()
    i = lab_id()
    lab = Lab(load("rack", {"hosts": 2}), i)

    def broken(h):
        raise RuntimeError("link failed")
    monkeypatch.setattr(lab, "_host_link", broken)
    with pytest.raises(RuntimeError, match="link failed"):
        lab.up()
    _nothing_left(i, before)


@needs_lab
def test_two_labs_side_by_side():
    before = root_links()
    a_id, b_id = lab_id(), lab_id()
    with Lab(load("rack", {"hosts": 2}), a_id) as a:
        with Lab(load("rack", {"hosts": 2, "rate": "100mbit"}), b_id) as b:
            with pytest.raises(LabError, match="exists already"):
                Lab(load("rack"), a_id).up()
            _rtt_ok(a, "h0", "h1")
            _rtt_ok(b, "h0", "h1")
        _nothing_left(b_id, before)
        _rtt_ok(a, "h1", "h0")             # a is untouched by b's teardown
    _nothing_left(a_id, before)


CRASH = """
import os, sys
from ina_fabric.host.lab import Lab, load
lab = Lab(load("rack", {"hosts": 2, "delay_ms": 1}), sys.argv[1]).up()
lab.start_switch()
p = lab.popen("h0", ["sleep", "30"])
print(p.pid, flush=True)
os._exit(3)                     # dies without tearing anything down
"""


@needs_lab
def test_down_cleans_up_after_a_crash():
    before = root_links()
    i = lab_id()
    r = subprocess.run([sys.executable, "-c", CRASH, i], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 3, r.stderr
    assert len(N.lab_namespaces(i)) == 3 and N.pids_in(N.lab_namespaces(i))
    out = subprocess.run([sys.executable, "-m", "ina_fabric.host.cli", "lab", "down",
                          "--id", i], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "3 namespaces" in out.stdout
    _nothing_left(i, before, [int(r.stdout.split()[0])])


@needs_lab
def test_delay_line_holds_the_delay_at_100mbit():
    """10 ms one way on h0's link (TAPs + the delay line, tbf 100 Mbit): a paced UDP
    stream of 80 Mbit/s h0 -> switch arrives 10 ms later within 1 ms at the median, and
    the delay line itself writes 99% of frames within 1 ms of their due time. On a shared
    2-core machine a burst of other work can starve even a real-time process for a
    moment, so a run that misses is measured once more (both runs are printed)."""
    import json
    delay = 10.0
    for attempt in range(2):
        with Lab(load("rack", {"hosts": 2, "rate": "100mbit", "delay_ms": delay}),
                 lab_id()) as lab:
            r = _rtt_ok(lab, "h0", "sw", count=10)
            owd = probe.one_way_delay(lab, "h0", "sw", rate="80mbit", seconds=2.0)
            lab.stop_service("delay-h0")   # SIGTERM: the delay line writes its statistics
            stats = json.loads((lab.state_dir / "delay-h0.json").read_text())
        q, late = owd["owd_ms"], stats["a_to_b"]["late_ms"]
        print(f"run {attempt}: rtt {r['rtt_ms']}; one way at 80 Mbit/s: {q}; "
              f"delay line lateness {late}; {stats['tuning']}")
        if delay <= q["p50"] <= delay + 1.0 and late["p99"] < 1.0:
            break
    assert owd["received"] >= 0.9 * owd["sent"] * 0.9
    assert 2 * delay <= r["rtt_ms"]["p50"] <= 2 * delay + 5    # Python probes, not RT
    assert q["p0"] >= delay
    assert delay <= q["p50"] <= delay + 1.0
    assert late["p99"] < 1.0


@needs_lab
def test_background_flows_fill_queues_and_stop_by_themselves():
    """Two bulk TCP flows h1 -> h0 and h2 -> h0 (incast) fill h0's downlink queue (tbf,
    20 ms): a probe from the switch to h0, which shares that link, sees the queue in its
    RTT; the flows and their sinks then exit after their time without being told. (One
    flow alone would not queue there: its own uplink, as fast, paces it.)"""
    from ina_fabric.host.lab.status import link_counters
    from ina_fabric.host.lab.traffic import Flow, start
    with Lab(load("rack", {"hosts": 3, "rate": "100mbit"}), lab_id()) as lab:
        idle = _rtt_ok(lab, "sw", "h0", count=20)["rtt_ms"]
        names = start(lab, [Flow("tcp", "h1", "h0", seconds=3.0),
                            Flow("tcp", "h2", "h0", seconds=3.0)])
        time.sleep(0.5)
        busy = probe.rtt(lab, "sw", "h0", count=40, interval_ms=10)["rtt_ms"]
        print(f"RTT switch -> h0 idle {idle}, beside two bulk flows into h0 {busy}")
        assert busy["p50"] > idle["p50"] + 5.0
        pids = [lab.services[n]["pid"] for n in names]
        t0 = time.monotonic()
        for n in names:
            lab._procs[n].wait(timeout=15)
        assert time.monotonic() - t0 < 10
        down = link_counters(lab)["h0"]["down"]
        assert down["bytes"] > 10e6 / 8
    assert all(not pathlib.Path(f"/proc/{p}/cmdline").exists() or
               pathlib.Path(f"/proc/{p}/stat").read_text().split()[2] == "Z" for p in pids)


def test_wan9_follows_the_schedule_topology():
    """wan9 is built from the optimizer's default topology: 9 islands, a full mesh of 36
    routed links whose delays are its latencies, addresses in the benchmark range."""
    from ina_fabric.host.schedule.topology import default_topology
    wt = default_topology()
    t = load("wan9", {"hosts": 2})
    assert [t.labels[s.name] for s in t.switches] == wt.names
    assert len(t.hosts) == 18 and len(t.wan) == 36
    tokyo, london = wt.names.index("Tokyo"), wt.names.index("London")
    w, = [w for w in t.wan if {w.a, w.b} == {f"i{tokyo}", f"i{london}"}]
    assert abs(2 * w.link.delay_ms - wt.rtt_ms("Tokyo", "London")) < 1e-6
    assert all(ln.subnet.subnet_of(__import__("ipaddress").ip_network("198.18.0.0/15"))
               for ln in t.wan)


@needs_lab
def test_wan9_lab_delays_and_routes():
    """The built wan9 (delays x 0.2): Tokyo -> London and New York -> Chicago round trips
    are the optimizer's latencies (the fastest of 10 within 1 ms, the median within 5 ms
    on a busy machine: 36 delay lines and the probes share two cores), routed switch to
    switch; an island's edge switch answers from another continent; nothing is left."""
    from ina_fabric.host.schedule.topology import default_topology
    wt = default_topology()
    before = root_links()
    i = lab_id()
    topo = load("wan9", {"delay_scale": 0.2})
    names = {v: k for k, v in topo.labels.items()}
    with Lab(topo, i) as lab:
        assert len([s for s in lab.services if s.startswith("wan-")]) == 36
        assert root_links() == before
        for a, b in (("Tokyo", "London"), ("New York", "Chicago")):
            r = probe.rtt(lab, f"{names[a]}h0", f"{names[b]}h0", count=10, interval_ms=5)
            want = 0.2 * wt.rtt_ms(a, b)
            fastest = min(r["samples_ms"])
            print(f"{a} -> {b}: RTT min {fastest:.2f} P50 {r['rtt_ms']['p50']:.2f} ms, "
                  f"configured {want:.2f} ms")
            assert r["lost"] == 0
            assert want <= fastest <= want + 1.0
            assert r["rtt_ms"]["p50"] <= want + 5.0
        host, port = lab.start_switch(names["London"])
        q = lab.run(f"{names['Tokyo']}h0", [sys.executable, "-c",
                    "from ina_fabric.host.switch import query_status as q; "
                    f"print(sorted(q(('{host}', {port}), timeout=2)))"], timeout=30)
        assert "counters" in q.stdout, q.stderr
    _nothing_left(i, before)
