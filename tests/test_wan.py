"""DoubleZero end to end, the parts that need no lab: the edge replicator's model, the
plan each island reads from schedule.json, and one real exchange on loopback (edge
aggregators = real ``ina switch`` servers, edge replicators = the real service loop,
islands = the real ``exchange``), checked against the exact averages. The wan9 runs
themselves are ``ina bench wan`` (docs/wan.md)."""

import os
import random
import socket
import threading
import time

import numpy as np
import pytest

from ina_fabric.host.wan import plan as P
from ina_fabric.host.wan.replicator import EdgeReplicator, serve
from ina_fabric.host.wan.exchange import Quantizer, exchange, mix, packets
from ina_fabric.protocol.fields import HEADER_BYTES, MsgType, field_offsets
from ina_fabric.protocol.numpy_view import pack

OFF = field_offsets()


def _three_islands():
    from ina_fabric.host.schedule.topology import topology_from_dict
    return topology_from_dict({"island": [{"name": "Tokyo"}, {"name": "New York"},
                                          {"name": "London"}]})


@pytest.fixture(scope="module")
def nine():
    """The lab's optimizer view of wan9 at 2 Mbit/s, and every family's candidate."""
    lab = P.LabNet(9, 2_000_000, 2_000_000, 1.0, 256)
    topo = P.schedule_topology(lab)
    net = P.net_config(lab, 78_000, 9_956, 0.002)
    best, cands, model = P.candidates(topo, net, time_budget_s=20)
    return lab, topo, net, best, cands, model


def test_edge_window_is_two_sets_of_w_slots_within_m():
    assert P.edge_window(9_956, 256) == 4          # 2 x 4 x 1 KB = 8 KB <= 9,956 B
    assert P.edge_window(8_192, 256) == 4
    assert P.edge_window(8_191, 256) == 2
    assert P.edge_window(100, 256) == 1
    assert P.edge_window(1 << 20, 256) == 512


def test_replicator_copies_once_per_destination_with_each_destinations_worker_id():
    table = {7: [(("10.0.1.254", 19900), 0), (("10.0.2.254", 19900), 1)]}
    r = EdgeReplicator(table, [("10.0.0.1", 47000)])
    d = pack(np.arange(4), job=7, seq=5, worker=9, exponent=3)
    out = r.process(d, ("10.0.0.1", 47000))
    assert [dst for dst, _ in out] == [("10.0.1.254", 19900), ("10.0.2.254", 19900)]
    assert [b[OFF["worker"]] for _, b in out] == [0, 1]
    for _, b in out:          # nothing else changes
        assert b[:OFF["worker"]] == d[:OFF["worker"]]
        assert b[OFF["worker"] + 1:] == d[OFF["worker"] + 1:]
    assert r.counters["copies"] == 2 and r.counters["rx"] == 1
    # not from the island's host, an unknown job, not DATA, truncated: dropped, counted
    assert r.process(d, ("10.0.0.2", 47000)) == []
    assert r.process(pack(np.arange(4), job=8), ("10.0.0.1", 47000)) == []
    assert r.process(pack(type=MsgType.RESULT, job=7), ("10.0.0.1", 47000)) == []
    assert r.process(d[:HEADER_BYTES - 1], ("10.0.0.1", 47000)) == []
    c = r.counters
    assert (c["drop_unknown_source"], c["drop_unknown_job"], c["drop_not_data"],
            c["drop_truncated"], c["copies"]) == (1, 1, 1, 1, 2)


def test_optimizer_choice_changes_with_edge_memory_on_the_lab_scale(nine):
    lab, topo, _, best, _, _ = nine
    assert best == "cliques-3"                      # the gateware's 9,956 B
    big = P.net_config(lab, 78_000, 1 << 20, 0.002)
    assert P.candidates(topo, big, time_budget_s=20)[0] == "all-to-all"


@pytest.mark.parametrize("label", ["all-to-all", "ring-gossip", "static-pairs",
                                   "one-peer-exp", "cliques-2", "cliques-3", "cliques-4",
                                   "cliques-8"])
def test_every_edge_job_member_has_a_replicator_entry_with_its_worker_id(nine, label):
    lab, topo, net, _, cands, model = nine
    doc = P.export(lab, topo, net, P.pick(cands, label), model, job_base=100)
    names = [i["name"] for i in doc["islands"]]
    tables = {n: P.replicator_table(doc, n) for n in names}
    plans = {n: P.island_plan(doc, n, 1.0) for n in names}
    for n in names:
        for rp in plans[n]:
            if rp.edge_job is None:
                assert rp.inbound == ()
                continue
            assert rp.edge_job.job >= 100 and rp.edge_job.window == 4
            assert rp.edge_job.mcast == ("198.18.%d.1" % names.index(n), P.HOST_PORT)
            assert len(rp.edge_job.members) == len(rp.inbound) >= 1
            for w, m in enumerate(rp.edge_job.members):
                src = names[[i["address"] for i in doc["islands"]].index(f"{m.ip}:{m.port}")]
                assert src in rp.inbound
                edge = ("198.18.%d.254" % names.index(n), P.EDGE_PORT)
                assert (edge, w) in tables[src][rp.edge_job.job]
        # one send per round at most, and a sender sends under the job its receivers hold
        for rp in plans[n]:
            if rp.send_job is not None:
                assert rp.rate > 0 and rp.offset_s >= 0
    # every copy a replicator makes lands in an edge job that expects that island
    total = sum(len(d) for t in tables.values() for d in t.values())
    assert total == sum(len(rp.inbound) for ps in plans.values() for rp in ps)


def test_quantized_sum_and_mixing():
    q = Quantizer(9)
    rng = np.random.default_rng(0)
    v = rng.normal(0, 1, 1000)
    arr = packets(v, 3, 10, 256, q)
    assert len(arr) == 4 and list(arr["h"]["seq"]) == [10, 11, 12, 13]
    back = q.dequantize(arr["e"].reshape(-1)[:1000].astype(float))
    assert np.max(np.abs(back - v)) <= 0.5 / q.scale


def _serve_switch(addr, key, stop):
    from ina_fabric.host.switch.server import SwitchServer
    srv = SwitchServer([], addr[0], addr[1], key=key)
    stop.append(srv)
    srv.serve_forever(install_signals=False)
    srv.close()


def test_three_islands_exchange_through_edge_replicators_and_aggregators():
    """One all-to-all round among three islands on loopback: each host sends its update
    once; its replicator makes the two copies; each edge sums the two inbound streams
    and sends one stream to its host; each island's mix is the exact average."""
    from ina_fabric.host.switch import send_job
    prefix = f"127.{random.Random(os.getpid()).randrange(100, 250)}"
    lab = P.LabNet(3, 100_000_000, 100_000_000, 0.05, 256, prefix=prefix)
    topo = P.schedule_topology(lab, _three_islands())
    net = P.net_config(lab, 8_000 * 4, 1 << 20, 0.002)
    _, cands, model = P.candidates(topo, net, time_budget_s=5)
    doc = P.export(lab, topo, net, P.pick(cands, "all-to-all"), model)
    names = [i["name"] for i in doc["islands"]]
    key = os.urandom(32)
    servers, threads, repls, stops = [], [], [], []
    try:
        for k in range(3):
            ip, port = lab.edge(k).rsplit(":", 1)
            t = threading.Thread(target=_serve_switch, args=((ip, int(port)), key, servers),
                                 daemon=True)
            t.start()
            threads.append(t)
            ip, port = lab.replicator(k).rsplit(":", 1)
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((ip, int(port)))
            hip, hport = lab.host(k).rsplit(":", 1)
            r = EdgeReplicator(P.replicator_table(doc, names[k]), [(hip, int(hport))])
            t = threading.Thread(target=serve, args=(s, r, lambda: bool(stops)), daemon=True)
            t.start()
            repls.append((r, s, t))
        while len(servers) < 3:
            time.sleep(0.01)
        plans = [P.island_plan(doc, n, 1.0)[0] for n in names]
        for k, rp in enumerate(plans):
            ip, port = lab.edge(k).rsplit(":", 1)
            for _ in range(20):
                try:
                    send_job((ip, int(port)), rp.edge_job, key=key, timeout=0.5)
                    break
                except (socket.timeout, ConnectionRefusedError):
                    continue
        rng = np.random.default_rng(1)
        vals = [rng.normal(0, 1, 8_000) for _ in range(3)]
        socks, results = [], [None] * 3
        for k in range(3):
            ip, port = lab.host(k).rsplit(":", 1)
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((ip, int(port)))
            socks.append(s)
        start = time.monotonic() + 0.1

        def island(k):
            rp = plans[k]
            ip, port = lab.replicator(k).rsplit(":", 1)
            results[k] = exchange(socks[k], vals[k], start=start, offset=rp.offset_s,
                                  rate=rp.rate, send_job=rp.send_job,
                                  send_to=(ip, int(port)), edge_job=rp.edge_job.job,
                                  seq0=0, elements=256, quant=Quantizer(3),
                                  session=doc["session"], timeout=10.0)
        ts = [threading.Thread(target=island, args=(k,)) for k in range(3)]
        [t.start() for t in ts]
        [t.join(20) for t in ts]
        avg = sum(vals) / 3
        npk = -(-8_000 // 256)
        for k in range(3):
            res = results[k]
            assert (res.sent, res.received, res.partial, res.missing) == (npk, npk, 0, 0)
            assert np.all(res.count == 2)
            np.testing.assert_allclose(mix(vals[k], res, 256), avg, atol=1e-6)
            r = repls[k][0]
            assert r.counters["rx"] == npk and r.counters["copies"] == 2 * npk
        for srv in servers:
            c = srv.model.counters
            assert c["results"] == npk and c["drop_unknown_source"] == 0
    finally:
        stops.append(1)
        for srv in servers:
            srv.stop()
        for r, s, t in repls:
            t.join(2)
            s.close()


# -- K = 2 hosts per island ---------------------------------------------------------------

def test_two_hosts_per_island_plan(nine):
    """K = 2: host h of island k is 198.18.k.(h+1); the edge's RESULT goes to the
    island's replicator, which fans it out to both hosts; the intra-island job has both
    hosts as workers (RESULT to each), an id no edge job of the run has, the edge
    window from M; its predicted time is P + 1 datagram times at the host link's rate."""
    _, topo, net, _, cands, model = nine
    lab = P.LabNet(9, 2_000_000, 2_000_000, 1.0, 256, hosts=2)
    assert lab.island_hosts(3) == ["198.18.3.1:47000", "198.18.3.2:47000"]
    for label in ("cliques-3", "all-to-all", "ring-gossip"):
        doc = P.export(lab, topo, net, P.pick(cands, label), model, job_base=200)
        assert doc["hosts_per_island"] == 2
        ids = {g["job"] for r in doc["rounds"] for g in r["groups"]} | {
            e["id"] for r in doc["rounds"] for g in r["groups"] for e in g["edge_jobs"]}
        assert doc["intra"]["job"] not in ids and 200 < doc["intra"]["job"] < 300
        names = [i["name"] for i in doc["islands"]]
        for k, n in enumerate(names):
            cfg = P.intra_job(doc, n, 0.5)
            assert [m.addr for m in cfg.members] == [("198.18.%d.1" % k, P.HOST_PORT),
                                                     ("198.18.%d.2" % k, P.HOST_PORT)]
            assert cfg.mcast is None and cfg.window == 4 and cfg.mode == "bounded"
            assert cfg.session == doc["session"]
            rt = P.result_table(doc, n)
            edge_ids = [rp.edge_job.job for rp in P.island_plan(doc, n, 0.5)
                        if rp.edge_job is not None]
            assert sorted(rt) == sorted(edge_ids)
            assert all(d == [("198.18.%d.1" % k, P.HOST_PORT), ("198.18.%d.2" % k,
                                                                 P.HOST_PORT)]
                       for d in rt.values())
            for rp in P.island_plan(doc, n, 0.5):
                if rp.edge_job is not None:
                    assert rp.edge_job.mcast == ("198.18.%d.254" % k, P.REPLICATOR_PORT)
    rate = 2_000_000 / 8 * P.payload_fraction(256)
    assert P.intra_predicted_s(lab, 76_840) == pytest.approx(77 * 1024 / rate)
    # K = 1 is unchanged: no intra job, no fan-out, the RESULT to the host
    one = P.export(P.LabNet(9, 2_000_000, 2_000_000, 1.0, 256), topo, net,
                   P.pick(cands, "cliques-3"), model)
    assert "intra" not in one and P.intra_job(one, "Tokyo", 0.5) is None
    assert P.result_table(one, "Tokyo") == {}


def test_replicator_fans_the_edge_result_out_to_every_host_of_the_island():
    edge, hosts = ("10.0.0.254", 19900), [("10.0.0.1", 47000), ("10.0.0.2", 47000)]
    r = EdgeReplicator({7: [(("10.0.1.254", 19900), 0)]}, hosts, {9: hosts}, edge)
    res = pack(np.arange(4), type=MsgType.RESULT, job=9, seq=3)
    out = r.process(res, edge)
    assert out == [(hosts[0], res), (hosts[1], res)]          # unchanged, one per host
    assert r.process(res, ("10.0.0.9", 19900)) == []           # not from its edge
    assert r.process(pack(type=MsgType.RESULT, job=8), edge) == []   # not its edge job
    d = pack(np.arange(4), job=7, seq=5)                        # the island's update
    assert len(r.process(d, hosts[0])) == 1
    c = r.counters
    assert (c["result_rx"], c["result_copies"], c["drop_unknown_source"],
            c["drop_unknown_job"], c["rx"], c["copies"]) == (1, 2, 1, 1, 4, 1)


def test_island_mean_divides_by_the_hosts_in_each_chunk():
    from ina_fabric.host.wan.exchange import ExchangeResult, island_mean
    own = np.arange(600, dtype=float)
    s = np.full(600, 10.0)
    res = ExchangeResult(s, np.array([2, 1, 0]), 0, 0, 3, 2, 1, 1)
    m = island_mean(own, res, 256)
    assert np.all(m[:256] == 5.0) and np.all(m[256:512] == 10.0)
    np.testing.assert_array_equal(m[512:], own[512:])


def test_a_cost_per_round_favours_fewer_rounds_per_cycle(nine):
    """K > 1 adds the intra-island step to every round, which the optimizer's round model
    does not see: re-scored with it, the choice keeps the optimizer's at no cost and
    moves to all-to-all (one round per cycle, exact average) when a round costs much."""
    _, _, net, best, cands, _ = nine
    assert P.best_with_round_cost(cands, 0.0, net.sigma_floor) == best == "cliques-3"
    assert P.best_with_round_cost(cands, 10.0, net.sigma_floor) == "all-to-all"
    c = cands["cliques-3"]
    assert P.cycle_with_round_cost(c, 0.5) == pytest.approx(c.t_cycle + 0.5 *
                                                            len(c.round_times))
