"""Per-call allreduce times beside background flows on the rack lab, Gloo and ina
alternating: where a worker's time goes beside an uplink flood or bulk TCP (issue 39,
docs/congestion.md, "A worker's share of its host's queue").

Four workers (h0-h3) and two background hosts (h4, h5) at 100 Mbit/s; one flow out of
h0 to h4 and one out of h2 to h5 (``--kind udp`` at ``--flood`` with ``--on``/``--off``
ms periods, or ``--kind tcp``: bulk, always on; ``--flood none``: no flows). Each
repetition: a barrier, Gloo's ``all_reduce`` of ``--floats`` float32, a barrier, ina's
call of the same (``--only`` runs one of them). Prints each backend's per-call times
(the slowest rank's), their median ratio, rank 0's refused sends, re-sends, window and
cuts per call, the flows' goodput while the calls ran (the background hosts' downlink
byte counters), and h0's uplink queue (tbf backlog sampled every 50 ms).

    sudo .venv/bin/python -m ina_fabric.bench.flood_probe --on 200 --off 300

A probe, not a benchmark: no JSON, no checks beyond each call's own. Needs root.
"""

import argparse
import json
import statistics as S
import subprocess
import sys
import threading
import time


def worker(a):
    import torch
    import torch.distributed as dist
    from ina_fabric.bench._ranks import lab_rank
    from ina_fabric.host.transport.switch_client import AllreduceStats
    state = lab_rank(a, 600)
    c = state.collective
    x = torch.randn(a.floats, generator=torch.Generator().manual_seed(1000 + a.rank)).numpy()
    c.allreduce(x)
    xt = torch.from_numpy(x.copy())
    rows = []
    for _ in range(a.reps):
        dist.barrier()
        t0 = time.monotonic()
        if a.only != "ina":
            dist.all_reduce(xt.clone())
        t1 = time.monotonic()
        dist.barrier()
        t2 = time.monotonic()
        st = c.allreduce(x)[1] if a.only != "gloo" else AllreduceStats()
        t3 = time.monotonic()
        rt = c._rtt
        rows.append((t1 - t0, t3 - t2, st.local_retries, st.retransmits, st.local_waits,
                     rt.cwnd, rt.srtt, rt.cuts, t0))
    every = [None] * a.world
    dist.all_gather_object(every, rows)
    if a.rank == 0:
        print(json.dumps(every), flush=True)
    state.close()
    dist.barrier()
    dist.destroy_process_group()


def report(a, res, samples):
    g = [max(res[r][i][0] for r in range(a.world)) * 1e3 for i in range(a.reps)]
    n = [max(res[r][i][1] for r in range(a.world)) * 1e3 for i in range(a.reps)]
    if a.only != "ina":
        print("gloo ms", [round(v) for v in g], "median", round(S.median(g)))
    if a.only != "gloo":
        print("ina  ms", [round(v) for v in n], "median", round(S.median(n)))
    if a.only == "both":
        print("gloo/ina", round(S.median(g) / S.median(n), 2))
    for i, row in enumerate(res[0]):
        print(f"rank 0 call {i}: refused {row[2]} re-sent {row[3]} waits {row[4]} "
              f"cwnd {row[5]:.1f} srtt {row[6] * 1e3:.1f} ms cuts {row[7]:.0f}")
    t0 = res[0][0][8]
    t1 = res[0][-1][8] + res[0][-1][0] + res[0][-1][1]
    during = [s for s in samples if t0 <= s[0] <= t1]
    if len(during) > 2:
        rate = (during[-1][2] - during[0][2]) * 8 / (during[-1][0] - during[0][0]) / 1e6
        print(f"flows' goodput while the calls ran: {rate:.1f} Mbit/s")
    q = sorted(s[1] for s in samples)
    if q:
        print(f"h0 uplink queue KB: median {S.median(q) / 1e3:.0f}, "
              f"P90 {q[9 * len(q) // 10] / 1e3:.0f}, max {q[-1] / 1e3:.0f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--kind", default="udp", choices=("udp", "tcp"), help="the flows")
    ap.add_argument("--flood", default="90mbit", help="udp rate while on; none: no flows")
    ap.add_argument("--on", type=float, default=1000.0, help="ms on")
    ap.add_argument("--off", type=float, default=0.0, help="ms off (0: always on)")
    ap.add_argument("--only", default="both", choices=("both", "gloo", "ina"))
    ap.add_argument("--reps", type=int, default=10, help="calls of each backend")
    ap.add_argument("--floats", type=int, default=1_150_000, help="float32 per call")
    ap.add_argument("--queue-ms", type=float, default=20.0, help="tbf queue per link end")
    ap.add_argument("--window", type=int, default=1024, help="job window")
    ap.add_argument("--inflight", type=int, default=1 << 20, help="bytes in flight")
    ap.add_argument("--elements", type=int, default=2048, help="int32 per datagram")
    ap.add_argument("--id", default="fp", help="lab id")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(a)
    from ina_fabric.bench._ranks import gather
    from ina_fabric.host.lab import Lab, load, traffic
    from ina_fabric.host.lab.status import link_counters
    from ina_fabric.host.lab.traffic import Flow
    topo = load("rack", {"hosts": a.world + 2, "rate": "100mbit", "mtu": 9000,
                         "queue_ms": a.queue_ms})
    with Lab(topo, a.id) as lab:
        lab.start_switch()
        if a.flood != "none":
            traffic.start(lab, [Flow(a.kind, src, dst, seconds=400, on_ms=a.on,
                                     off_ms=a.off, rate=a.flood)
                                for src, dst in (("h0", "h4"), ("h2", "h5"))])
        master = f"{lab.address('h0')}:29500"
        procs = [lab.popen(h, [sys.executable, "-m", __spec__.name, "--worker", "--rank", r,
                               "--world", a.world, "--master", master, "--reps", a.reps,
                               "--elements", a.elements, "--window", a.window,
                               "--inflight", a.inflight, "--floats", a.floats,
                               "--only", a.only],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r, h in enumerate(lab.hosts[:a.world])]
        samples, stop = [], threading.Event()

        def sample():
            while not stop.is_set():
                c = link_counters(lab)
                samples.append((time.monotonic(), c["h0"]["up"].get("backlog", 0),
                                c["h4"]["down"]["bytes"] + c["h5"]["down"]["bytes"]))
                stop.wait(0.05)
        th = threading.Thread(target=sample, daemon=True)
        th.start()
        try:
            res = gather(procs, 400, list(range(a.world)))
        finally:
            stop.set()
            th.join()
    report(a, res, samples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
