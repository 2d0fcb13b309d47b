"""Allreduce past one rack: the `fabric` lab (racks of hosts under top-of-rack switches,
uplinks to a spine, 4:1 oversubscribed by default), three ways on the same links:
tree (each rack's `ina switch` sums its hosts and sends one partial sum up to the spine's),
flat (a single `ina switch` at the spine, every host a direct member: each uplink carries
one copy per host) and real Gloo (torch.distributed, ranks numbered rack by rack, so its
ring crosses each uplink once each way: Gloo's best case). With a single rack, "tree" is
that rack's switch alone (the baseline of `tree_over_one_rack`: a job inside one rack
needs no spine). Needs root.

One row per (hosts, racks) in bench/results/fabric.json: the medians of interleaved
repetitions (the order rotates), each time the slowest rank's; every result checked
(ina's sum against Gloo's on every rank within the quantization bound, and bitwise the
same bytes on every rank). `--straggler-ms`: a bounded-mode phase where one host sleeps
that long before every call; P50/P99 per call against the same calls without it, in
leaf deadlines."""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

from ina_fabric.bench._ranks import gather
from ina_fabric.bench._results import write

SIZES = {"1MB": 1 << 20, "4MB": 4 << 20, "16MB": 16 << 20, "64MB": 64 << 20}
MODES = ("tree", "flat", "gloo")
JOBS = {"tree": 1, "flat": 2, "tree-bounded": 3, "flat-bounded": 4}
GLOO_PORT = 29500


def _quantiles(xs):
    import numpy as np
    return {"p50": float(np.percentile(xs, 50)), "p99": float(np.percentile(xs, 99)),
            "max": float(max(xs))}


# -- the worker: one per host namespace ------------------------------------------------

def _client(a, mode, bounded=False):
    """This rank's SwitchClient for ``mode``: flat at the spine, tree at its rack's
    switch (the job installed on the whole tree by rank 0). The bounded jobs (the
    straggler phase) have the job window ``a.straggler_window``."""
    from ina_fabric.host.ddp.hook import InaHookState
    name = f"{mode}-bounded" if bounded else mode
    os.environ.pop("INA_JOB", None)
    kw = dict(elements=a.elements, window=a.straggler_window if bounded else a.window,
              connect_timeout=5.0, bind_port=None,
              job=JOBS[name], mode=a.bounded_mode if bounded else "reliable",
              deadline=a.deadline_ms / 1e3 if bounded else None)
    # each worker paces its DATA at its fair share of its path's narrowest link: flat,
    # H hosts share their rack's uplink; tree, one partial sum per rack crosses it
    os.environ["INA_PACE_RATE"] = str(a.flat_pace if mode == "flat" else a.tree_pace)
    if mode == "flat":
        os.environ["INA_SWITCH"] = a.spine
        state = InaHookState.from_env(**kw)
    else:
        state = _tree_state(a, kw)
    if not state.use_switch:
        raise SystemExit(f"{name}: no switch answered in the lab")
    state.collective.max_inflight_bytes = a.inflight
    return state


def _tree_state(a, kw):
    """A tree job: every rank a member of its rack's switch (its id there: --worker-id),
    on port 20000 + 1000 x job + rank; rank 0 draws the session, gathers the ranks'
    addresses and installs the job on the tree (``host.switch.tree.install_tree``: each
    rack's switch, then the spine's) before any rank takes it as a static job. With one
    rack, the job is the rack switch's alone (it needs no spine): the one-rack baseline
    of ``tree_over_one_rack``."""
    import torch.distributed as dist
    from ina_fabric.host.ddp.hook import InaHookState, local_address_towards
    from ina_fabric.host.switch.tree import Leaf, Tree, install_tree
    from ina_fabric.protocol.jobtable import job_defaults, new_session

    def ip_port(text):
        ip, _, port = text.rpartition(":")
        return ip, int(port)
    base = 20000 + 1000 * kw["job"]
    me = f"{local_address_towards(ip_port(a.tor))}:{base + a.rank}"
    seen = [None] * a.world
    dist.all_gather_object(seen, (a.tor, me))
    box = [new_session() if a.rank == 0 else None]
    if a.rank == 0:
        racks = {}
        for tor, addr in seen:                   # ranks rack by rack: dicts keep order
            racks.setdefault(tor, []).append(addr)
        s = job_defaults("ethernet", elements=kw["elements"], window=kw["window"],
                         mode=kw["mode"], deadline=kw["deadline"])
        if len(racks) == 1:
            from ina_fabric.host.switch import send_job
            from ina_fabric.protocol.jobtable import JobConfig
            (tor, workers), = racks.items()
            send_job(ip_port(tor), JobConfig.from_settings(kw["job"], workers, s,
                                                           session=box[0]), timeout=2.0)
        else:
            install_tree(Tree(ip_port(a.spine), tuple(Leaf(ip_port(t), tuple(w))
                                                      for t, w in racks.items())),
                         kw["job"], s, session=box[0], timeout=2.0)
    dist.broadcast_object_list(box, src=0)       # also: the job is installed
    os.environ["INA_SWITCH"], os.environ["INA_WORKER"] = a.tor, str(a.worker_id)
    try:
        return InaHookState.from_env(configure=False, session=box[0],
                                     **{**kw, "bind_port": base})
    finally:
        os.environ.pop("INA_WORKER")


def _digest(z) -> str:
    return hashlib.sha256(z.tobytes()).hexdigest()


def _worker(a):
    from datetime import timedelta
    import numpy as np
    import torch
    import torch.distributed as dist
    from ina_fabric.host.transport import quantize as Q
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}", rank=a.rank,
                            world_size=a.world, timeout=timedelta(seconds=900))
    modes = a.modes.split(",")
    states = {m: _client(a, m) for m in modes if m != "gloo"}
    n = SIZES[a.size] // 4
    x = torch.randn(n, generator=torch.Generator().manual_seed(1000 + a.rank))
    gmax = torch.tensor([float(x.abs().max())])
    dist.all_reduce(gmax, op=dist.ReduceOp.MAX)
    e = int(np.frexp(gmax.item())[1])
    # ina's bound from quantization, plus float32 rounding of Gloo's own float sum
    tol = Q.error_bound(e, a.world) + a.world * gmax.item() * 2.0 ** -22
    worst, same = 0.0, True

    def call(m):
        if m == "gloo":
            y = x.clone()
            dist.all_reduce(y)
            return y.numpy()
        return states[m].collective.allreduce(x.numpy())[0]

    def check(results):
        """ina's sums against Gloo's (within the bound), and the same bytes on every
        rank (digests gathered over Gloo)."""
        nonlocal worst, same
        g = results["gloo"] if "gloo" in results else None
        for m, z in results.items():
            if m == "gloo":
                continue
            if g is not None:
                worst = max(worst, float(np.abs(z - g).max()) / tol)
            digests = [None] * a.world
            dist.all_gather_object(digests, _digest(z))
            same = same and len(set(digests)) == 1

    check({m: call(m) for m in modes})          # warm-up, and the first check
    pids = ()
    if a.rank == 0 and os.environ.get("INA_LAB"):   # the lab's processes: ranks, switches
        from ina_fabric.host.lab import netns as N
        pids = list(N.pids_in(N.lab_namespaces(os.environ["INA_LAB"])))
    times = {m: [] for m in modes}
    # CPU s busy: the machine, the lab's; wall s; the lab's threads' s on a CPU and s
    # runnable but waiting for one
    busy = {m: [0.0] * 5 for m in modes}
    for rep in range(a.reps):
        k = rep % len(modes)
        results = {}
        for m in modes[k:] + modes[:k]:         # the order rotates
            dist.barrier()
            c0 = _cpu_seconds(pids)
            t = time.perf_counter()
            results[m] = call(m)
            c1 = _cpu_seconds(pids)
            busy[m][2] += time.perf_counter() - t
            for i, j in ((0, 0), (1, 1), (3, 2), (4, 3)):
                busy[m][i] += c1[j] - c0[j]
            dt = torch.tensor([time.perf_counter() - t])
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)    # the slowest rank's time
            times[m].append(dt.item())
        check(results)
    w = torch.tensor([worst, 0.0 if same else 1.0])
    dist.all_reduce(w, op=dist.ReduceOp.MAX)
    cores = os.cpu_count()
    out = {"times": times, "worst_error_over_bound": w[0].item(),
           "cpu_busy": {m: b / max(t, 1e-9) / cores for m, (b, _, t, _, _) in busy.items()},
           "cpu_lab": {m: b / max(t, 1e-9) / cores for m, (_, b, t, _, _) in busy.items()},
           "cpu_lab_wait": {m: w / max(r + w, 1e-9)
                            for m, (_, _, _, r, w) in busy.items()},
           "identical": w[1].item() == 0.0,
           "stats": {m: s.collective.total.as_dict() for m, s in states.items()}}
    for s in states.values():
        s.close()
    if a.straggler_ms > 0:
        out["straggler"] = _straggler(a, dist, torch, np)
    if a.rank == 0:
        print(json.dumps(out), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _straggler(a, dist, torch, np):
    """Bounded mode, small calls: rank ``a.straggler_rank`` sleeps ``straggler_ms``
    before every call of the straggler rounds (none in the baseline rounds, interleaved);
    per call, the slowest of the other ranks' times. Every rank's bytes are compared.
    A call that raises on any rank ends that mode's phase on every rank (the flag goes
    round with the call's time), recorded as ``failed`` with each failing rank's error,
    so the figures already measured are kept."""
    out = {}
    n = SIZES[a.straggler_size] // 4
    x = torch.randn(n, generator=torch.Generator().manual_seed(7 + a.rank)).numpy()
    for m in [m for m in a.straggler_modes.split(",") if m in a.modes.split(",")
              and m != "gloo"]:
        state = _client(a, m, bounded=True)
        c = state.collective
        base, slow, same, failed = [], [], True, None
        partial = {False: 0, True: 0}            # rank 0's partial slots, per phase
        for i in range(-1, 2 * a.straggler_calls):       # -1: the warm-up call
            late = i >= 0 and i % 2 == 1
            dist.barrier()
            if late and a.rank == a.straggler_rank:
                time.sleep(a.straggler_ms / 1e3)
            t = time.perf_counter()
            err = None
            try:
                z, st = c.allreduce(x)
            except Exception as e:  # noqa: BLE001 (every rank must learn it, then stop)
                err, z, st = f"{a.rank}: {type(e).__name__}: {e}"[:400], None, None
            dt = time.perf_counter() - t
            mine = torch.tensor([0.0 if a.rank == a.straggler_rank else dt,
                                 0.0 if err is None else 1.0])
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            if mine[1].item():
                errors = [None] * a.world
                dist.all_gather_object(errors, err)
                failed = [e for e in errors if e]
                break
            if i < 0:
                continue
            partial[late] += st.partial_slots
            (slow if late else base).append(mine[0].item())
            digests = [None] * a.world
            dist.all_gather_object(digests, _digest(z))
            same = same and len(set(digests)) == 1
        st = c.total.as_dict()
        try:
            state.close()
        except Exception:  # noqa: BLE001 (a failed phase may have lost its job already)
            pass
        out[m] = {"base_s": base, "straggler_s": slow, "identical": same,
                  "failed": failed, "partial_slots": st["partial_slots"],
                  "partial_slots_base": partial[False],
                  "partial_slots_straggler": partial[True],
                  "abandoned_slots": st["abandoned_slots"]}
    return out


# -- the driver ------------------------------------------------------------------------

def measure(a, racks, per_rack, modes):
    from ina_fabric.host.lab import Lab, load
    topo = load("fabric", {"racks": racks, "hosts_per_rack": per_rack, "rate": a.rate,
                           "mtu": a.mtu, "queue_ms": a.queue_ms,
                           "oversubscription": a.oversubscription})
    with Lab(topo, a.id) as lab:
        switches = lab.start_fabric(tree="tree" in modes)
        spine = f"{switches[0][0]}:{switches[0][1]}"
        master = f"{lab.address(lab.hosts[0])}:{GLOO_PORT}"
        world = len(lab.hosts)
        host_rate, up_rate = topo.hosts[0].link.rate, topo.wan[0].link.rate
        flat_pace = int(min(host_rate, up_rate / per_rack)) if a.pace else 0
        # one rack: the tree is its switch alone, the uplink is not on its path
        tree_pace = int(min(host_rate, up_rate) if racks > 1 else host_rate) if a.pace else 0
        straggler = lab.hosts.index(a.straggler_host) if a.straggler_host in lab.hosts \
            else min(1, world - 1)
        procs = []
        for r, h in enumerate(lab.hosts):             # ranks rack by rack
            tor = lab.topo.host(h).switch
            index = lab.topo.rack_hosts(tor).index(h)
            argv = [sys.executable, "-m", "ina_fabric.bench.bench_fabric", "--worker",
                    "--rank", r, "--world", world, "--worker-id", index, "--master", master, "--spine", spine,
                    "--tor", f"{lab.address(tor)}:{switches[0][1]}", "--modes",
                    ",".join(modes), "--size", a.size, "--reps", a.reps, "--elements",
                    a.elements, "--window", a.window, "--inflight", a.inflight,
                    "--straggler-ms", a.straggler_ms, "--straggler-rank", straggler,
                    "--straggler-size", a.straggler_size, "--straggler-calls",
                    a.straggler_calls, "--straggler-window", a.straggler_window,
                    "--straggler-modes", a.straggler_modes, "--deadline-ms", a.deadline_ms, "--bounded-mode",
                    a.bounded_mode, "--flat-pace", flat_pace, "--tree-pace", tree_pace]
            procs.append(lab.popen(h, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True))
        load0 = os.getloadavg()[0]
        res = gather(procs, a.timeout, lab.hosts, tail=1500)
        res["loadavg"] = [load0, os.getloadavg()[0]]   # 1-minute, at the start and end
        res["straggler_host"] = lab.hosts[straggler]
        res["uplink_rate"] = topo.wan[0].link.rate
        res["oversubscription"] = topo.oversubscription
        res["pace"] = {"flat": flat_pace, "tree": tree_pace}
        return res


def _cpu_seconds(pids=()):
    """(CPU seconds the machine spent busy so far, nice time included: the lab runs
    niced here, as heavy jobs must; CPU seconds of ``pids`` so far; seconds their
    threads ran and seconds they were runnable but waited for a CPU, from the
    scheduler's own account, ``/proc/PID/task/TID/schedstat``), from /proc."""
    tck = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        v = [int(t) for t in f.readline().split()[1:]]
    machine = (sum(v[:8]) - v[3] - v[4]) / tck   # all but idle and iowait
    own, ran, waited = 0, 0, 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
            own += int(st[11]) + int(st[12])
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    r, w = f.read().split()[:2]
                ran, waited = ran + int(r), waited + int(w)
        except (OSError, IndexError, ValueError):
            pass
    return machine, own / tck, ran / 1e9, waited / 1e9


#: bytes on an Ethernet link per INA datagram besides its elements: the INA header, UDP,
#: IPv4, Ethernet header and FCS, preamble and inter-frame gap
_FRAME = 8 + 20 + 18 + 20


def wire_seconds(size, elements, per_rack, rate, uplink_rate, hosts, racks=None):
    """Per mode, the seconds the links alone need for one allreduce of ``size`` bytes of
    float32 (the saturation evidence: a time near it is link-bound). tree: one copy up and
    one down over each host link and uplink (full duplex); flat: ``per_rack`` copies over
    each uplink each way; gloo: the ring's 2(N-1)/N of the buffer over each link each way
    (TCP's own headers left out). With ``racks`` 1 the tree (the rack's switch alone)
    and Gloo stay inside the rack: the uplink is on flat's path only."""
    from ina_fabric.protocol.fields import HEADER_BYTES
    n = size // 4
    packets = -(-n // elements)
    on_wire = size + packets * (HEADER_BYTES + _FRAME)
    path = rate if racks == 1 else min(rate, uplink_rate)
    tree = on_wire * 8 / path
    return {"tree": tree,
            "flat": max(on_wire * 8 / min(rate, uplink_rate),
                        per_rack * on_wire * 8 / uplink_rate),
            "gloo": 2 * (hosts - 1) / hosts * size * 8 / path if hosts > 1 else 0.0}


#: a lab whose runnable threads waited this share of their time for a CPU was starved
LAB_WAIT_STARVED = 0.2


def saturation(row, wire, busy, wait=None):
    """What set a row's times, from its own figures: each mode's time over its wire time,
    the machine's busy share during its calls (``busy``) and the share of their runnable
    time the lab's threads waited for a CPU (``wait``); ``cpu_bound`` where the time is
    more than 10% above the wire's and the CPUs were over 90% busy or the lab's threads
    waited over ``LAB_WAIT_STARVED`` of their time."""
    wait = wait or {}
    over = {m: row[f"{m}_s"] / wire[m] for m in wire if row.get(f"{m}_s") and wire[m]}
    return {"wire_s": wire, "over_wire": over,
            "cpu_busy_max": max(busy.values()) if busy else None,
            "cpu_lab_wait_max": max(wait.values()) if wait else None,
            "cpu_bound": sorted(m for m in over if over[m] > 1.1 and (
                busy.get(m, 0) > 0.9 or wait.get(m, 0) > LAB_WAIT_STARVED))}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ina bench fabric", description=__doc__.strip(),
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--shapes", default=None,
                    help="comma-separated RACKSxHOSTS_PER_RACK fabrics; the one-rack shape "
                         "with the most hosts per rack is tree_over_one_rack's base "
                         "(default 1x4,4x4; --quick: 1x2,2x2)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    ap.add_argument("--rate", default="100mbit", help="host link rate")
    ap.add_argument("--oversubscription", type=float, default=4.0,
                    help="rack hosts' rate / uplink rate")
    ap.add_argument("--size", default="64MB", choices=SIZES, help="allreduce per rank")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions (>= 1)")
    ap.add_argument("--mtu", type=int, default=9000, help="lab link MTU (jumbo frames)")
    ap.add_argument("--elements", type=int, default=0,
                    help="int32 per packet (0: the most that fit the MTU, a power of two)")
    ap.add_argument("--window", type=int, default=64, help="job window (slots)")
    ap.add_argument("--inflight", type=int, default=512 << 10,
                    help="bytes a worker keeps in flight at most")
    ap.add_argument("--queue-ms", type=float, default=50.0, help="tbf queue per link end")
    ap.add_argument("--straggler-ms", type=float, default=0.0,
                    help="> 0: the bounded-mode straggler phase, one host this late")
    ap.add_argument("--straggler-host", default="r0h1", help="the late host")
    ap.add_argument("--straggler-size", default="1MB", choices=SIZES,
                    help="allreduce per call in the straggler phase")
    ap.add_argument("--straggler-calls", type=int, default=20,
                    help="calls with the straggler (and as many without, interleaved)")
    ap.add_argument("--straggler-modes", default="tree",
                    help="the modes of the straggler phase (of tree, flat)")
    ap.add_argument("--straggler-window", type=int, default=256,
                    help="job window (slots) of the straggler phase's bounded jobs: a "
                         "bounded worker may fall 2 x this less its call's window "
                         "datagrams behind the others before its results are gone "
                         "(AllreduceTooLate); 64 left 45 ms at 100 Mbit, which a "
                         "CPU-starved rank or leaf here overran")
    ap.add_argument("--deadline-ms", type=float, default=10.0,
                    help="slot deadline of the bounded jobs (each level's)")
    ap.add_argument("--bounded-mode", default="bounded-skip",
                    choices=("bounded", "bounded-skip"), help="the straggler phase's mode")
    ap.add_argument("--pace", action="store_true",
                    help="each worker paced at its fair share of its path's narrowest link "
                         "(flat uplink/H, tree min(host, uplink), one rack's tree the host "
                         "rate); default unpaced, as `ina bench lab-allreduce` (on these "
                         "loaded cores the pacer delivered about 2/3 of its rate)")
    ap.add_argument("--quick", action="store_true",
                    help="shapes 1x2,2x2 (unless --shapes), 4MB, 1 repetition")
    ap.add_argument("--id", default="fabric", help="lab id")
    ap.add_argument("--timeout", type=float, default=1500.0, help="seconds per shape")
    # the worker side (run by the bench inside each host's namespace)
    for flag, kind in (("--worker", None), ("--rank", int), ("--world", int),
                       ("--master", str), ("--spine", str), ("--tor", str),
                       ("--straggler-rank", int), ("--worker-id", int), ("--flat-pace", int), ("--tree-pace", int)):
        if kind is None:
            ap.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
        else:
            ap.add_argument(flag, type=kind, help=argparse.SUPPRESS)
    return ap


def main(argv=()):
    ap = _parser()
    a = ap.parse_args(list(argv))
    if a.worker:
        return _worker(a)
    from ina_fabric.host.lab import available, parse_rate
    why = available()
    if why:
        print(f"fabric: skipped: {why}")
        return 0
    if a.quick:
        a.shapes, a.size, a.reps = a.shapes or "1x2,2x2", "4MB", 1
    a.shapes = a.shapes or "1x4,4x4"
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes) or a.reps < 1:
        raise SystemExit(f"fabric: --modes from {', '.join(MODES)}, --reps >= 1")
    try:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in a.shapes.split(",")]
        assert all(len(s) == 2 and min(s) >= 1 for s in shapes)
    except (ValueError, AssertionError):
        raise SystemExit(f"fabric: --shapes {a.shapes!r}: e.g. 1x4,4x4") from None
    if a.elements <= 0:
        a.elements = 1 << ((a.mtu - 20 - 8 - 48) // 4).bit_length() - 1
    rate = parse_rate(a.rate)
    rows, raw = [], {}
    for racks, per_rack in shapes:
        res = measure(a, racks, per_rack, modes)
        busy = res["cpu_busy"]
        med = {m: statistics.median(res["times"][m]) for m in modes}
        checked = res["identical"] and res["worst_error_over_bound"] <= 1.0
        row = {"hosts": racks * per_rack, "racks": racks, "hosts_per_rack": per_rack,
               "oversubscription": res["oversubscription"], "rate_mbit": rate / 1e6,
               "uplink_mbit": res["uplink_rate"] / 1e6, "size": SIZES[a.size],
               "checked": checked, "identical": res["identical"],
               "worst_error_over_bound": res["worst_error_over_bound"],
               "cpu_busy": busy, "cpu_lab": res["cpu_lab"],
               "cpu_lab_wait": res.get("cpu_lab_wait", {}), "cpu_cores": os.cpu_count(),
               "loadavg": res.get("loadavg")}
        for m in MODES:
            ts = res["times"].get(m)
            row[f"{m}_s"] = med[m] if ts else None
            row[f"{m}_s_min"] = min(ts) if ts else None
            row[f"{m}_s_max"] = max(ts) if ts else None
            row[f"{m}_s_all"] = ts
        row["gloo_over_tree"] = med["gloo"] / med["tree"] if {"gloo", "tree"} <= set(med) \
            else None
        row["flat_over_tree"] = med["flat"] / med["tree"] if {"flat", "tree"} <= set(med) \
            else None
        row["gloo_over_flat"] = med["gloo"] / med["flat"] if {"gloo", "flat"} <= set(med) \
            else None
        row["saturation"] = saturation(row, wire_seconds(
            SIZES[a.size], a.elements, per_rack, rate, res["uplink_rate"], racks * per_rack,
            racks),
            busy, row["cpu_lab_wait"])
        row["retransmits"] = {m: s["retransmits"] for m, s in res["stats"].items()}
        row["pace_bits"] = res["pace"]
        if "straggler" in res:
            row["straggler"] = {"host": res["straggler_host"], "ms": a.straggler_ms,
                                "deadline_ms": a.deadline_ms, "mode": a.bounded_mode,
                                "size": SIZES[a.straggler_size]}
            for m, s in res["straggler"].items():
                if s["failed"] or not s["base_s"] or not s["straggler_s"]:
                    row["straggler"][m] = {"failed": s["failed"] or ["no calls"],
                                           "calls_done": len(s["straggler_s"])}
                    continue
                b, q = _quantiles(s["base_s"]), _quantiles(s["straggler_s"])
                row["straggler"][m] = {
                    "p50_s": q["p50"], "p99_s": q["p99"], "base_p50_s": b["p50"],
                    "base_p99_s": b["p99"], "identical": s["identical"],
                    "cost_p50_deadlines": (q["p50"] - b["p50"]) / (a.deadline_ms / 1e3),
                    "cost_p99_deadlines": (q["p99"] - b["p99"]) / (a.deadline_ms / 1e3),
                    "partial_slots": s["partial_slots"],
                    "partial_slots_base": s["partial_slots_base"],
                    "partial_slots_straggler": s["partial_slots_straggler"],
                    "abandoned_slots": s["abandoned_slots"]}
                row["checked"] = row["checked"] and s["identical"]
        rows.append(row)
        raw[f"{racks}x{per_rack}"] = res
        print(f"{racks} racks x {per_rack} at {a.rate} ({res['oversubscription']:g}:1), "
              f"{a.size}: " + ", ".join(f"{m} {med[m]:.2f} s" for m in modes)
              + "".join(f", {k} {row[k]:.2f}" for k in ("gloo_over_tree", "flat_over_tree",
                                                        "gloo_over_flat") if row[k])
              + f"; results {'checked' if checked else 'NOT within the bound/identical'}"
              + "; CPU busy (machine/this lab) " + ", ".join(
                  f"{m} {busy[m]:.0%}/{res['cpu_lab'][m]:.0%}" for m in modes)
              + "; lab threads waiting for a CPU " + ", ".join(
                  f"{m} {v:.0%}" for m, v in row["cpu_lab_wait"].items())
              + (f"; load average {row['loadavg'][0]:.1f}-{row['loadavg'][1]:.1f}"
                 if row["loadavg"] else "")
              + "; time / wire time " + ", ".join(
                  f"{m} {v:.2f}" for m, v in row["saturation"]["over_wire"].items()),
              flush=True)
        if "straggler" in row:
            for m in modes:
                s = row["straggler"].get(m)
                if s and "failed" in s:
                    print(f"  straggler {a.straggler_ms:g} ms on {res['straggler_host']} "
                          f"({m}, {a.bounded_mode}): FAILED after {s['calls_done']} calls "
                          f"with the straggler: {s['failed'][0]}", flush=True)
                elif s:
                    print(f"  straggler {a.straggler_ms:g} ms on {res['straggler_host']} "
                          f"({m}, {a.bounded_mode}, deadline {a.deadline_ms:g} ms): per call "
                          f"P50 {s['p50_s'] * 1e3:.1f} ms, P99 {s['p99_s'] * 1e3:.1f} ms "
                          f"(without: {s['base_p50_s'] * 1e3:.1f} / "
                          f"{s['base_p99_s'] * 1e3:.1f} ms): "
                          f"{s['cost_p50_deadlines']:.2f} / {s['cost_p99_deadlines']:.2f} "
                          f"deadlines; partial slots (rank 0) "
                          f"{s['partial_slots_straggler']} with, {s['partial_slots_base']} "
                          f"without", flush=True)
    one_rack = [r for r in rows if r["racks"] == 1 and r["tree_s"]]
    base = max(one_rack, key=lambda r: r["hosts"]) if one_rack else None
    for r in rows:
        r["tree_over_one_rack"] = r["tree_s"] / base["tree_s"] if base and r["tree_s"] \
            else None
    saturated = any(b > 0.9 for r in rows for b in r["cpu_busy"].values()) or \
        any(r["saturation"]["cpu_bound"] for r in rows)
    write("fabric", {"rows": rows, "modes": modes,
                     "reps": a.reps, "mtu": a.mtu, "elements": a.elements,
                     "window": a.window, "inflight": a.inflight, "queue_ms": a.queue_ms,
                     "straggler_window": a.straggler_window,
                     "cpu_saturated": saturated,
                     "cpu_bound_rows": [f"{r['racks']}x{r['hosts_per_rack']}" for r in rows
                                        if r["saturation"]["cpu_bound"]],
                     "note": "medians of interleaved repetitions (the order rotates); each "
                             "time the slowest rank's; same links for every mode; Gloo's "
                             "ranks rack by rack; cpu_busy: the whole machine's share of "
                             "its cores busy (shared with other users, nice time "
                             "included), per mode, over its timed calls; cpu_lab: the "
                             "share the lab's own processes (ranks, switches) used; "
                             "cpu_lab_wait: the share of their runnable time the lab's "
                             "threads waited for a CPU (schedstat); loadavg: the 1-minute "
                             "load average at the shape's start and end"})
    if saturated:
        bound = [f"{r['racks']}x{r['hosts_per_rack']} ({', '.join(r['saturation']['cpu_bound'])})"
                 for r in rows if r["saturation"]["cpu_bound"]]
        print("fabric: the machine's CPUs were over 90% busy during a mode's calls, or "
              f"the lab's threads waited over {LAB_WAIT_STARVED:.0%} of their time for one"
              + (f"; CPU-bound (over 10% above the wire time): {'; '.join(bound)}: try a "
                 "lower --rate" if bound else "; every time within 10% of the wire's"))
    failed = [f"{r['racks']}x{r['hosts_per_rack']} {m}" for r in rows
              for m, v in r.get("straggler", {}).items() if isinstance(v, dict)
              and "failed" in v]
    if failed:
        print(f"fabric: the straggler phase failed: {', '.join(failed)}")
    return 0 if all(r["checked"] for r in rows) and not failed else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
