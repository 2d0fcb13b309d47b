"""Runs on the ``wan9`` lab: bring it up with an edge aggregator (``ina switch``) in
every island's edge namespace, run exported schedules with one ``torchrun`` per island
(the edge replicators restarted for each schedule), run Gloo's ring across every island
over the same links, and reduce the islands' JSON lines to per-round and per-run figures.
"""

import json
import os
import queue
import subprocess
import sys
import threading
import time

import numpy as np

from ina_fabric.host.lab import Lab, load
from .plan import LabNet

__all__ = ["wan_lab", "run_schedules", "run_gloo", "summarize", "time_to_target"]


def wan_lab(lab_id: str, rate: str, wan_rate: str, delay_scale: float, queue_ms=200.0,
            edges=True, topology="wan9", hosts=1) -> Lab:
    """wan9 (or another islands topology) with ``hosts`` hosts per island (i<k>h0 ..,
    198.18.k.1 ..), static ARP, and ``ina switch`` at SCHED_FIFO on every island's
    bridge (``edges``)."""
    topo = load(topology, {"hosts": hosts, "rate": rate, "wan_rate": wan_rate,
                         "delay_scale": delay_scale, "queue_ms": queue_ms, "mtu": 1500})
    lab = Lab(topo, lab_id).up()
    try:
        static_neighbours(lab)
        if edges:
            for sw in topo.switches:
                lab.start_switch(sw.name)
                realtime(lab.services[f"switch-{sw.name}" if f"switch-{sw.name}" in
                                      lab.services else "switch"]["pid"])
    except BaseException:
        lab.down()
        raise
    return lab


def static_neighbours(lab: Lab) -> int:
    """Permanent ARP entries on every inter-island link (both ends) and between every
    host and its edge: a WAN link is point to point, and an ARP exchange over it costs a
    round trip of up to 220 ms that would hold back the first datagrams of a stream (and
    widen the skew an edge aggregator must hold) the first time an edge sends to a peer.
    Returns how many entries it added."""
    from pyroute2.netlink.rtnl import ndmsg
    from ina_fabric.host.lab import netns as N
    perm = ndmsg.states["permanent"]

    def mac(node, ifname):
        with N.ipr(lab.ns(node)) as ip:
            return ip.get_links(ip.link_lookup(ifname=ifname)[0])[0].get_attr(
                "IFLA_ADDRESS")

    def add(node, ifname, dst, lladdr):
        with N.ipr(lab.ns(node)) as ip:
            ip.neigh("replace", dst=str(dst), lladdr=lladdr,
                     ifindex=ip.link_lookup(ifname=ifname)[0], state=perm)

    n = 0
    for w in lab.topo.wan:
        a_addr, b_addr = w.addresses
        add(w.a, f"w{w.b}", b_addr, mac(w.b, f"w{w.a}"))
        add(w.b, f"w{w.a}", a_addr, mac(w.a, f"w{w.b}"))
        n += 2
    for h in lab.topo.hosts:
        add(h.name, "eth0", lab.address(h.switch), mac(h.switch, "br0"))
        add(h.switch, "br0", h.address, mac(h.name, "eth0"))
        n += 2
    return n


def realtime(pid, priority=10):
    """SCHED_FIFO for a lab service that stands in for network hardware (the edge
    aggregator), as the delay lines have; on 2 shared cores a normal-priority switch
    is late by tens of ms now and then. Returns whether it took."""
    try:
        os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(priority))
        return True
    except (OSError, AttributeError):
        return False


class _Islands:
    """The islands' processes and their JSON lines."""

    def __init__(self, lab, procs, logs):
        self.lab, self.procs, self.logs = lab, procs, logs
        self.events = queue.Queue()
        self.seen = []               # every event so far, in arrival order
        for p in procs:
            threading.Thread(target=self._pump, args=(p.stdout,), daemon=True).start()

    def _pump(self, stream):
        for line in stream:
            if line.startswith("{"):
                try:
                    self.events.put(json.loads(line))
                except json.JSONDecodeError:
                    pass

    def dead(self):
        for (h, log), p in zip(self.logs, self.procs):
            if p.poll() not in (None, 0):
                log.flush()
                log.seek(0)
                return f"{h}: exited {p.returncode}: {log.read()[-1500:]}"
        return None

    def wait_for(self, pred, count, timeout):
        """Until ``count`` events so far satisfy ``pred``; returns every event so far."""
        end = time.monotonic() + timeout
        while sum(1 for e in self.seen if pred(e)) < count:
            try:
                self.seen.append(self.events.get(timeout=0.5))
            except queue.Empty:
                why = self.dead()
                if why:
                    raise RuntimeError(why)
                if time.monotonic() > end:
                    raise TimeoutError(f"islands: {sum(1 for e in self.seen if pred(e))}"
                                       f"/{count} events in {timeout}s")
        return list(self.seen)

    def close(self):
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
        for _, log in self.logs:
            log.close()


def _launch(lab, argvs, tag):
    procs, logs = [], []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0"}
    for h, argv in argvs:
        log = open(lab.state_dir / f"{tag}-{h}.log", "w+")
        procs.append(lab.popen(h, argv, env=env, stdout=subprocess.PIPE, stderr=log,
                               text=True))
        logs.append((h, log))
    return _Islands(lab, procs, logs)


def _go(barrier_dir, tag):
    barrier_dir.mkdir(parents=True, exist_ok=True)
    tmp = barrier_dir / f".{tag}.orchestrator"
    tmp.write_text(repr(time.monotonic()))
    os.replace(tmp, barrier_dir / f"{tag}.orchestrator")


def run_schedules(lab: Lab, lnet: LabNet, runs: list[dict], train: dict, *,
                  guard_s=0.03, wan_guard_s=0.005, progress=print,
                  timeout_per_run=900.0) -> dict:
    """``runs``: [{"name", "doc" (schedule.json), "rounds", "deadline_s", "timeout_s"}].
    One torchrun per host (``lnet.hosts`` per island) for all of them; returns {run
    name: [events]} and the replicators' counters per run."""
    names = [lab.topo.labels[s.name] for s in lab.topo.switches]
    bdir = lab.state_dir / "wan-barrier"
    specs = []
    for j, run in enumerate(runs):
        path = lab.state_dir / f"schedule-{run['name']}.json"
        path.write_text(json.dumps(run["doc"], indent=1))
        specs.append({"name": run["name"], "schedule": str(path), "rounds": run["rounds"],
                      "deadline_s": run["deadline_s"], "timeout_s": run["timeout_s"]})
    argvs = []
    from .plan import payload_fraction
    host_rate = lnet.rate_bits / 8 * payload_fraction(lnet.elements)
    for k, sw in enumerate(lab.topo.switches):
        for h in range(lnet.hosts):
            plan = {"island": k, "names": names, "host": lnet.host(k, h),
                    "hosts": lnet.hosts, "host_index": h, "host_rate": host_rate,
                    "edge": lnet.edge(k), "replicator": lnet.replicator(k),
                    "elements": lnet.elements, "train": train, "barrier_dir": str(bdir),
                    "guard_s": guard_s, "wan_guard_s": wan_guard_s, "runs": specs}
            pp = lab.state_dir / f"island-{k}-h{h}.json"
            pp.write_text(json.dumps(plan))
            argvs.append((f"{sw.name}h{h}", [sys.executable, "-m", "torch.distributed.run",
                                              "--standalone", "--nproc-per-node", "1", "-m",
                                              "ina_fabric.host.wan.island", "schedule", pp]))
    isl = _launch(lab, argvs, "island")
    nproc = len(argvs)
    out, counters = {}, {}
    try:
        for spec in specs:
            for k, sw in enumerate(lab.topo.switches):
                name = f"repl-{sw.name}"
                if name in lab.services:
                    lab.stop_service(name)
                lab.start_service(name, sw.name, [
                    sys.executable, "-m", "ina_fabric.host.wan.replicator",
                    "--listen", lnet.replicator(k), "--schedule", spec["schedule"],
                    "--island", names[k], "--hosts", ",".join(lnet.island_hosts(k)),
                    "--edge", lnet.edge(k),
                    "--stats", lab.state_dir / f"repl-{spec['name']}-{k}.json"], ready=True)
            _go(bdir, f"{spec['name']}-go")
            last = spec["rounds"] - 1
            evs = isl.wait_for(lambda e, s=spec: e.get("ev") == "round" and
                               e["run"] == s["name"] and e["round"] == last,
                               nproc, timeout_per_run)
            out[spec["name"]] = [e for e in evs if e.get("run") == spec["name"]]
            for k, sw in enumerate(lab.topo.switches):
                lab.stop_service(f"repl-{sw.name}")
            counters[spec["name"]] = [
                json.loads((lab.state_dir / f"repl-{spec['name']}-{k}.json").read_text())
                for k in range(len(names))]
            if progress:
                s = summarize(out[spec["name"]])
                progress(f"  {spec['name']:28s} {spec['rounds']:3d} rounds, round time "
                         f"measured/predicted {s['ratio_by_round']}, final loss "
                         f"{s['loss'][-1]:.3f}")
        isl.wait_for(lambda e: e.get("ev") == "done", nproc, 120)
    finally:
        isl.close()
    return {"events": out, "replicators": counters}


def run_gloo(lab: Lab, runs: list[dict], train: dict, *, port=29411, progress=print,
             timeout=1800.0) -> dict:
    """Gloo's ring allreduce of the parameters across every host of every island (torchrun
    ``--nnodes N``, rendezvous on island 0's host 0, Gloo on each host's eth0; rank
    k*K + h is host h of island k)."""
    hosts = lab.hosts
    plan = {"train": train, "runs": [{"name": r["name"], "rounds": r["rounds"]}
                                     for r in runs]}
    pp = lab.state_dir / "gloo.json"
    pp.write_text(json.dumps(plan))
    master = lab.address(hosts[0])
    argvs = [(h, [sys.executable, "-m", "torch.distributed.run", "--nnodes", len(hosts),
                  "--node-rank", i, "--nproc-per-node", 1, "--master-addr", master,
                  "--master-port", port, "-m", "ina_fabric.host.wan.island", "gloo", pp])
             for i, h in enumerate(hosts)]
    isl = _launch(lab, argvs, "gloo")
    out = {}
    try:
        evs = isl.wait_for(lambda e: e.get("ev") == "done", len(hosts), timeout)
        for r in runs:
            out[r["name"]] = [e for e in evs if e.get("run") == r["name"]]
            if progress:
                s = summarize(out[r["name"]])
                progress(f"  {r['name']:28s} {r['rounds']:3d} rounds, "
                         f"{np.median(s['round_s']) * 1e3:.0f} ms per allreduce round, "
                         f"final loss {s['loss'][-1]:.3f}")
    finally:
        isl.close()
    return out


def summarize(events: list[dict]) -> dict:
    """Per round: the exchange's measured time (round start to the last island's last
    aggregate datagram), its prediction, the wall time since the run's start at the end
    of the round (the last island's), and the mean loss and accuracy over islands."""
    starts = [e["t0"] for e in events if e.get("ev") == "start"]
    rounds = {}
    for e in events:
        if e.get("ev") == "round":
            rounds.setdefault(e["round"], []).append(e)
    t0 = max(starts) if starts else min(e["t_start"] for r in rounds.values() for e in r)
    rs = sorted(rounds)
    meas = [max(e["t_done"] for e in rounds[r]) - max(e["t_start"] for e in rounds[r])
            for r in rs]
    pred = [rounds[r][0].get("predicted_s") for r in rs]
    cyc = [rounds[r][0].get("cycle_round", 0) for r in rs]
    doc = {"rounds": len(rs), "round_s": meas,
           "wall_s": [max(e["t_mixed"] for e in rounds[r]) - t0 for r in rs],
           "loss": [float(np.mean([e["loss"] for e in rounds[r]])) for r in rs],
           "acc": [float(np.mean([e["acc"] for e in rounds[r]])) for r in rs],
           "partial": int(sum(e.get("partial", 0) for r in rs for e in rounds[r])),
           "missing": int(sum(e.get("missing", 0) for r in rs for e in rounds[r])),
           # datagrams each island sent per round (K > 1: host 0's; the others send none)
           "sent_per_update": sorted({sum(e["sent"] for e in rounds[r]
                                          if e["island"] == i and "sent" in e)
                                      for r in rs for i in {e["island"] for e in rounds[r]}
                                      if any("sent" in e for e in rounds[r])})}
    if any("digest" in e for r in rs for e in rounds[r]):
        # every host of an island ends every round with the same model
        doc["hosts_identical"] = all(
            len({e["digest"] for e in rounds[r] if e["island"] == i}) == 1
            for r in rs for i in {e["island"] for e in rounds[r]})
    if any("t_intra_done" in e for r in rs for e in rounds[r]):
        # K > 1: the intra-island step (round start to the last host's island sum) and
        # the WAN step (its own start to the last aggregate) apart, each against its
        # own prediction
        intra = [max(e["t_intra_done"] for e in rounds[r]) - max(e["t_start"] for e in
                                                                   rounds[r]) for r in rs]
        wan = [max(e["t_done"] for e in rounds[r]) - max(e["t_wan_start"] for e in
                                                           rounds[r]) for r in rs]
        ip = rounds[rs[0]][0]["intra_predicted_s"]
        doc["intra"] = {"predicted_s": ip, "measured_s": float(np.median(intra)),
                        "measured_max_s": float(max(intra)),
                        "ratio": float(np.median(intra) / ip),
                        "partial": int(sum(e["intra_partial"] for r in rs
                                           for e in rounds[r])),
                        "missing": int(sum(e["intra_missing"] for r in rs
                                           for e in rounds[r]))}
        by = {}
        for r, c, m in zip(rs, cyc, wan):
            by.setdefault(c, ([], rounds[r][0]["wan_predicted_s"]))[0].append(m)
        doc["wan_cycle"] = [{"round": c, "predicted_s": p,
                             "measured_s": float(np.median(ms)),
                             "ratio": float(np.median(ms) / p)}
                            for c, (ms, p) in sorted(by.items())]
    if pred[0] is not None:
        by = {}
        for c, m, p in zip(cyc, meas, pred):
            by.setdefault(c, ([], p))[0].append(m)
        doc["cycle"] = [{"round": c, "predicted_s": p, "measured_s": float(np.median(ms)),
                         "measured_min_s": float(min(ms)), "measured_max_s": float(max(ms)),
                         "ratio": float(np.median(ms) / p)}
                        for c, (ms, p) in sorted(by.items())]
        doc["ratio_by_round"] = [round(x["ratio"], 3) for x in doc["cycle"]]
        doc["measured_cycle_s"] = float(sum(x["measured_s"] for x in doc["cycle"]))
        doc["predicted_cycle_s"] = float(sum(x["predicted_s"] for x in doc["cycle"]))
    else:
        doc["ratio_by_round"] = []
    return doc


def time_to_target(summary: dict, target: float) -> float:
    for t, l in zip(summary["wall_s"], summary["loss"]):
        if l <= target:
            return float(t)
    return float("inf")
