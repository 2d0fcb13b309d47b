"""The board in the loop: digits training through the Versa board's whole datapath in
Verilator on a TAP (``ina train --engine board``), against the same run through the
software switch; then a short bounded-mode run whose deadline partials come from the
board. Root (a namespace and a TAP). Writes ``board_loop.json``.

Figures: ``accuracy`` (the board run's final test accuracy; ``target_reached``),
``replicas_identical`` (every rank of the board run has the same parameters, and they are
bitwise those of the software-switch run: the same seed, job window and elements per
packet), ``datagrams_per_s`` (INA datagrams the board took in, plus the frames it sent,
per wall second of simulating), ``sim_time_ratio`` (simulated seconds of the board's
125 MHz clock per wall second of simulating: how much slower than the real board), and
the bounded run's partials as the board's core counted them and as rank 0 saw them.
One run each (a training run through the board takes many minutes here); the rates are
also given per training step, min / median / max, from the board's per-run totals.
"""

import time

from ina_fabric.bench._results import write


def _run(cfg):
    from ina_fabric.host.ddp.train import run_training
    t = time.perf_counter()
    r = run_training(cfg, timeout=7200)
    return r, time.perf_counter() - t


N_BOUNDED = 640      # elements of the bounded allreduce: ten packets of the board's 64


def _bounded_rank(rank, world, store, net, deadline, late_s):
    """A rank of the bounded allreduce, inside the board's namespace: rank 0 installs
    the job (a sealed CONTROL); the last rank calls ``late_s`` after the others."""
    import numpy as np
    net.enter()
    from ina_fabric.host.ddp.hook import local_mac
    from ina_fabric.host.switch import send_job
    from ina_fabric.host.switch.board import TAP_ADDRESS
    from ina_fabric.host.transport import SwitchClient
    from ina_fabric.protocol.jobtable import JobConfig, new_session
    client = SwitchClient(net.switch, 9, rank, world, 8, 64, "bounded",
                          bind=(TAP_ADDRESS.split("/")[0], 0), deadline=deadline,
                          rto=0.5, connect_timeout=30.0)
    mac = local_mac(client.address[0])
    store.set(f"addr{rank}", f"{client.address[0]}:{client.address[1]}@{mac}")
    if rank == 0:
        members = tuple(store.get(f"addr{r}").decode() for r in range(world))
        cfg = JobConfig(9, members, 8, 64, deadline, "bounded", session=new_session())
        send_job(net.switch, cfg, timeout=10)
        store.set("session", str(cfg.session))
    client.start(int(store.get("session")))
    if rank == world - 1:
        time.sleep(late_s)
    x = np.full(N_BOUNDED, rank + 1, np.float32)
    y, st = client.allreduce(x)
    out = (y.tobytes(), st.as_dict() if hasattr(st, "as_dict") else dict(st.__dict__))
    client.close()
    return out


def bounded(workers, deadline_ms, late_s):
    """A bounded allreduce through the board where the last rank is ``late_s`` late:
    its slots expire on the board's clock (the deadline, in simulated time), the board
    sends PARTIALs without it, and its late DATA gets the stored partial back."""
    from ina_fabric.host.cluster import run_ranks
    from ina_fabric.host.switch.board import BoardNet
    from ina_fabric.host.switch.keys import switch_key
    with BoardNet(switch_key(create=True)) as net:
        res = run_ranks(workers, _bounded_rank, net, deadline_ms / 1e3, late_s, timeout=600)
    core = (net.stats or {}).get("core", {})
    return {"workers": workers, "deadline_ms": deadline_ms, "late_s": late_s,
            "elements": N_BOUNDED, "board_partials": core.get("partials", 0),
            "board_late": core.get("late", 0), "board_results": core.get("results", 0),
            "board_resent": core.get("resent", 0),
            "ranks_identical": len({y for y, _ in res}) == 1,
            "rank0_partial_slots": res[0][1].get("partial_slots"),
            "board_core_counters": core}


LAB_ID = "board"     # the lab --lab builds (torn down after)


def _lab_rank(a):
    """One rank of ``--lab``, in its lab host's namespace: Gloo over eth0 (the ranks'
    agreement, and the float sum to check against), the hook's client on the lab's
    switch (the board; rank 0 installs the job with a sealed CONTROL), ``a.iters``
    allreduces of ``a.n`` elements, the last rank ``a.late_s`` late; rank 0 prints its
    figures and the board's STATUS as a JSON line."""
    import hashlib
    import json
    import os
    from datetime import timedelta
    import numpy as np
    import torch
    import torch.distributed as dist
    from ina_fabric.host.ddp.hook import setup_hook_state
    from ina_fabric.host.transport import quantize as Q
    from ina_fabric.protocol.control_client import query_status
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}", rank=a.rank,
                            world_size=a.world, timeout=timedelta(seconds=600))
    st = setup_hook_state(job=a.job, mode=a.mode, window=8, elements=64,
                          deadline=a.deadline_ms / 1e3, connect_timeout=30.0)
    if not st.use_switch:
        raise SystemExit("the board did not answer in the lab")
    calls = []
    for it in range(a.iters):
        rng = np.random.default_rng([a.rank, it])
        x = (rng.standard_normal(a.n) * 10 ** rng.uniform(-2, 2, a.n)).astype(np.float32)
        want = torch.from_numpy(x.copy())
        dist.all_reduce(want)
        gmax = torch.tensor([float(np.abs(x).max())])
        dist.all_reduce(gmax, op=dist.ReduceOp.MAX)
        dist.barrier()
        if a.late_s and a.rank == a.world - 1:
            time.sleep(a.late_s)
        t = time.monotonic()
        y, stats = st.collective.allreduce(x)
        secs = time.monotonic() - t
        tol = Q.error_bound(int(np.frexp(gmax.item())[1]), a.world) + \
            a.world * gmax.item() * 2.0 ** -22
        hashes = [None] * a.world
        dist.all_gather_object(hashes, hashlib.sha256(y.tobytes()).hexdigest()[:16])
        calls.append({"seconds": secs, "ranks_identical": len(set(hashes)) == 1,
                      "error_over_bound": float(np.abs(y - want.numpy()).max() / tol),
                      "stats": {k: v for k, v in stats.as_dict().items() if v}})
    dist.barrier()
    if a.rank == 0:
        status = query_status(st.collective.switch, timeout=10.0)
        print(json.dumps({"calls": calls, "status": status}), flush=True)
    st.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _lab_allreduce(lab, mode, job, n, iters, late_s, deadline_ms, timeout):
    import subprocess
    import sys
    from ina_fabric.bench._ranks import gather
    master = f"{lab.address(lab.hosts[0])}:29541"
    procs = [lab.popen(h, [sys.executable, "-m", "ina_fabric.bench.bench_board",
                           "--lab-rank", r, "--world", len(lab.hosts), "--master", master,
                           "--mode", mode, "--job", job, "--n", n, "--iters", iters,
                           "--late-s", late_s, "--deadline-ms", deadline_ms],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r, h in enumerate(lab.hosts)]
    return gather(procs, timeout, lab.hosts)


def lab(hosts, late_s, deadline_ms, timeout=900.0):
    """``ina lab up rack --switch board`` (lab ``LAB_ID``): the board on a TAP in the
    switch namespace's bridge; from the hosts, ping and ARP, a reliable allreduce (every
    rank's result identical, within the quantization bound of Gloo's float sum) and a
    bounded one with the last rank ``late_s`` late; the board's STATUS after each.
    Torn down at the end."""
    from ina_fabric.host.lab import Lab, load
    out = {"hosts": hosts}
    t = time.monotonic()
    with Lab(load("rack", {"hosts": hosts}), LAB_ID) as lab:
        lab.start_switch(engine="board")
        out["switch_up_s"] = time.monotonic() - t
        ip = lab.address(lab.topo.switches[0].name)
        ping = lab.run(lab.hosts[-1], ["ping", "-c", "3", "-W", "10", ip], timeout=120)
        neigh = lab.run(lab.hosts[-1], ["ip", "neigh", "show", ip], timeout=30)
        out["ping"] = ping.stdout.strip().splitlines()[-2:]
        out["ping_ok"] = ping.returncode == 0
        out["neighbour"] = neigh.stdout.strip()
        out["reliable"] = _lab_allreduce(lab, "reliable", 3, 2000, 3, 0.0, deadline_ms,
                                         timeout)
        out["bounded"] = _lab_allreduce(lab, "bounded", 4, N_BOUNDED, 2, late_s,
                                        deadline_ms, timeout)
    return out


def _lab_summary(f):
    rel, bnd = f["reliable"], f["bounded"]
    c = bnd["status"]["counters"]
    return (f"lab: ping {'answered' if f['ping_ok'] else 'NOT answered'} ({f['ping'][-1]}); "
            f"ARP: {f['neighbour']}; reliable: ranks identical "
            f"{all(x['ranks_identical'] for x in rel['calls'])}, worst error / bound "
            f"{max(x['error_over_bound'] for x in rel['calls']):.3f}; bounded: the board's "
            f"STATUS partials {c.get('partials', 0)}, late {c.get('late', 0)}, resent "
            f"{c.get('resent', 0)}; ranks identical "
            f"{all(x['ranks_identical'] for x in bnd['calls'])}")


def main(argv=()):
    import argparse
    import dataclasses
    ap = argparse.ArgumentParser(prog="ina bench board", description=__doc__.strip())
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--max-epochs", type=int, default=10,
                    help="cap of the reliable runs (they stop at the workload's target)")
    ap.add_argument("--max-steps", type=int, default=0,
                    help="stop the reliable runs after this many steps (0: at the target)")
    ap.add_argument("--deadline-ms", type=float, default=0.1,
                    help="the bounded run's slot deadline (simulated time on the board)")
    ap.add_argument("--bounded-late-s", type=float, default=2.0,
                    help="the bounded allreduce: the last rank calls this many wall seconds "
                         "after the others (0: no bounded run)")
    ap.add_argument("--lab", action="store_true",
                    help="instead: `ina lab up rack --switch board` (lab id board), ping, "
                         "ARP, a reliable and a bounded allreduce from the lab hosts, the "
                         "board's STATUS; torn down after (figures: board_lab.json)")
    for name, kind in (("--lab-rank", int), ("--world", int), ("--master", str),
                       ("--mode", str), ("--job", int), ("--n", int), ("--iters", int),
                       ("--late-s", float)):
        ap.add_argument(name, type=kind, help=argparse.SUPPRESS)
    args = ap.parse_args(list(argv))
    if args.lab_rank is not None:
        args.rank = args.lab_rank
        return _lab_rank(args)
    from ina_fabric.host.switch.board import board_params, why_not
    from ina_fabric.host.lab.netns import available
    why = why_not() or available()
    if why:
        ap.error(why)
    if args.lab:
        figs = lab(args.workers, args.bounded_late_s or 2.0, args.deadline_ms)
        print(_lab_summary(figs), flush=True)
        write("board_lab", figs)
        ok = figs["ping_ok"] and all(x["ranks_identical"] and x["error_over_bound"] <= 1
                                     for x in figs["reliable"]["calls"])
        return 0 if ok else 1
    from ina_fabric.host.ddp.train import TrainConfig
    P = board_params()
    base = TrainConfig(workload="digits", workers=args.workers, backend="ina",
                       window=P.window, elements=P.elements, max_epochs=args.max_epochs,
                       max_steps=args.max_steps or None)
    print(f"board run: digits, {args.workers} workers, window {P.window}, {P.elements} "
          f"elements/packet (the Versa's core)", flush=True)
    board, board_s = _run(dataclasses.replace(base, switch_engine="board"))
    print(f"software-switch run (same seed, window, elements)", flush=True)
    soft, soft_s = _run(dataclasses.replace(base, switch_engine="fast"))
    b = board.switch_board
    busy = b["simulating_wall_s"]
    dgrams = b["core"].get("rx", 0) + b["p0_tx_frames"]
    figs = {
        "workers": args.workers, "window": P.window, "elements": P.elements,
        "accuracy": board.final_accuracy,
        "target_reached": board.time_to_accuracy is not None,
        "software_switch_accuracy": soft.final_accuracy,
        "steps": board.steps, "software_switch_steps": soft.steps,
        "replicas_identical": len(set(board.param_hashes)) == 1
        and board.param_hashes == soft.param_hashes and board.fallbacks == 0,
        "param_hash": board.param_hashes[0] if board.param_hashes else None,
        "datagrams_per_s": dgrams / busy if busy else None,
        "datagrams_in": b["core"].get("rx", 0), "frames_out": b["p0_tx_frames"],
        "tx_bad_fcs": b["p0_tx_bad_fcs"],
        "sim_time_ratio": b["sim_time_ratio"],
        "simulated_s": b["simulated_s"], "simulating_wall_s": busy,
        "board_run_wall_s": board_s, "software_run_wall_s": soft_s,
        "seconds_per_step": board.seconds / board.steps if board.steps else None,
        "software_seconds_per_step": soft.seconds / soft.steps if soft.steps else None,
        "board_core_counters": b["core"], "board_port0": b["port0"],
        "retransmits_rank0": (board.stats or {}).get("retransmits"),
    }
    print(f"board: accuracy {figs['accuracy']:.3f} in {board.steps} steps "
          f"(software switch {figs['software_switch_accuracy']:.3f} in {soft.steps}); "
          f"replicas identical to the software switch's: {figs['replicas_identical']}; "
          f"{figs['datagrams_per_s']:.0f} datagrams/s; simulated/wall "
          f"{figs['sim_time_ratio']:.2e}", flush=True)
    if args.bounded_late_s > 0:
        figs["bounded"] = bounded(args.workers, args.deadline_ms, args.bounded_late_s)
        bd = figs["bounded"]
        print(f"bounded: the board sent {bd['board_partials']} PARTIAL slots "
              f"({bd['board_late']} late DATA answered with the stored partial); every "
              f"rank's result identical: {bd['ranks_identical']}; rank 0's slots partial: "
              f"{bd['rank0_partial_slots']}", flush=True)
    write("board_loop", figs)
    return 0 if figs["replicas_identical"] and figs["target_reached"] else 1


if __name__ == "__main__":
    import sys
    raise SystemExit(main(sys.argv[1:]))
