"""WAN schedule optimizer: rotating cliques of islands with multicast and edge-FPGA
aggregation (docs/schedule.md).

    ina schedule optimize --topology FILE --memory 64M --update-bytes 1G
    ina schedule sweep-memory            table + PNG: best clique size against M
    ina schedule simulate                the optimizer's round times, checked by simulation
    ina schedule train                   decentralized training vs all-reduce baselines
    ina schedule topology                print the topology and its latencies

Sizes are bytes, as in every ina command: K, M, G, T are powers of 1024 with or without
B or iB (64M = 64MB = 64MiB); a plain number (1e9) is bytes.

Each action writes into --out DIR (default ina-out/schedule).
"""

import sys

HELP = "WAN schedule optimizer: rotating cliques, memory sweep, simulator, training"

def parse_size(text) -> float:
    from ._common import parse_size as _bytes
    return float(_bytes(text))


def _common(p, memory=True):
    p.add_argument("--topology", metavar="FILE", help="TOML/JSON topology (default: the "
                   "9-city one in host/schedule/default_topology.toml)")
    if memory:
        p.add_argument("--memory", metavar="M", help="FPGA memory per island, bytes "
                       "(default: the gateware's slot memory, hw/ina/params.py)")
    p.add_argument("--update-bytes", metavar="S", default="1e9",
                   help="bytes each island exchanges per round")
    p.add_argument("--jitter-us", type=float, default=10.0,
                   help="arrival-time uncertainty the FPGA buffer absorbs")
    p.add_argument("--slot-window", metavar="BYTES", help="FPGA state needed at zero skew "
                   "(default: one set of W slots of the gateware)")
    p.add_argument("--no-multicast", action="store_true", help="senders send k-1 copies")
    p.add_argument("--no-fpga", action="store_true", help="no in-line aggregation")
    p.add_argument("--sigma-floor", type=float, default=1e-3,
                   help="sigma2 below this counts as converged")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-budget", type=float, default=50.0,
                   help="optimizer time limit in seconds")


def add_arguments(p):
    from ._common import add_output_arguments
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    o = sub.add_parser("optimize", help="find the best schedule; print it, write "
                       "schedule.json (for the host runtime) and, with --plot, "
                       "schedule.png (round map)")
    _common(o)
    add_output_arguments(o, "schedule")
    s = sub.add_parser("sweep-memory", help="best schedule against FPGA memory: table, "
                       "sweep_memory.json and, with --plot, sweep_memory.png")
    _common(s, memory=False)
    s.add_argument("--memories", help="comma-separated sizes (default: 10k..10G and the "
                   "gateware's)")
    add_output_arguments(s, "schedule")
    m = sub.add_parser("simulate", help="simulate the optimizer's schedule; compare round times")
    _common(m)
    m.add_argument("--chunks", type=int, default=0,
                   help="chunks per update (default: fine enough for the buffer check)")
    t = sub.add_parser("train", help="decentralized training vs all-reduce baselines "
                       "(schedule_train.json; with --plot, schedule_train.png)")
    _common(t)
    t.add_argument("--rounds", type=int, default=120)
    t.add_argument("--local-steps", type=int, default=8)
    t.add_argument("--compute-s", type=float, default=0.3,
                   help="simulated compute time of the local steps per round")
    add_output_arguments(t, "schedule")
    g = sub.add_parser("topology", help="print islands, bandwidths and RTTs")
    g.add_argument("--topology", metavar="FILE")


def _setup(args, need_memory=True):
    from ..cli import CliError
    from ..schedule.topology import load_topology, default_topology, WanTopologyError
    from ..schedule.model import NetConfig
    from ..schedule.hwparams import default_memory
    try:
        topo = load_topology(args.topology) if args.topology else default_topology()
    except WanTopologyError as e:
        raise CliError(str(e)) from None
    if not need_memory:
        return topo, None, ""
    m_default, window, note = default_memory()
    try:
        S = parse_size(args.update_bytes)
        M = parse_size(args.memory) if getattr(args, "memory", None) else m_default
        w = parse_size(args.slot_window) if args.slot_window else window
    except ValueError as e:
        raise CliError(str(e)) from None
    if getattr(args, "memory", None):
        note = f"M = {M:.4g} B (--memory)"
    if S <= 0 or M < 0 or w < 0:
        raise CliError("--update-bytes must be > 0 and --memory/--slot-window >= 0")
    if args.jitter_us < 0 or not 0 < args.sigma_floor < 1:
        raise CliError("--jitter-us must be >= 0 and --sigma-floor in (0, 1)")
    net = NetConfig(update_bytes=S, memory_bytes=M, slot_window_bytes=w,
                    jitter_s=args.jitter_us * 1e-6, multicast=not args.no_multicast,
                    fpga=not args.no_fpga, sigma_floor=args.sigma_floor)
    return topo, net, note


def _label(c):
    return c.family if c.family != "cliques" else f"cliques-{c.k}"


def _print_schedule(topo, model, cand):
    for r, rnd in enumerate(cand.schedule.rounds):
        plans = model.plan(rnd)
        print(f"  round {r + 1}: {1e3 * cand.round_times[r]:8.1f} ms")
        for p in plans:
            members = ", ".join(topo.names[i] for i in p.islands)
            kind = "clique" if all(set(rnd.inbound[i]) | {i} == set(p.islands)
                                   for i in p.islands) else "group"
            slow = " (slowed by M)" if p.memory_bound else ""
            print(f"     {kind} [{members}]  {1e3 * p.time:7.1f} ms  "
                  f"{p.rate * 8 / 1e9:6.1f} Gb/s{slow}  max skew "
                  f"{1e3 * max(p.skew.values(), default=0):.2f} ms")


def _optimize(args):
    from ..schedule.search import optimize
    from ..schedule.model import RoundModel
    from ..schedule.export import schedule_json, write_schedule_json
    topo, net, note = _setup(args)
    model = RoundModel(topo, net)
    res = optimize(topo, net, seed=args.seed, time_budget_s=args.time_budget, model=model)
    print(f"{topo.n} islands ({topo.source}); S = {net.update_bytes:.4g} B; {note}")
    print(f"search: {res.evaluated} schedules scored in {res.solve_s:.2f} s "
          f"({'exact for R<=2' if res.exact else 'heuristic'})")
    print(f"{'family':16s} {'rounds':>6s} {'T_cycle ms':>10s} {'sigma2':>9s} {'obj 1/s':>9s}  method")
    for c in res.candidates:
        print(f"{_label(c):16s} {len(c.schedule.rounds):6d} {1e3 * c.t_cycle:10.1f} "
              f"{c.sigma2:9.3g} {c.objective:9.3f}  {c.method}")
    b = res.best
    print(f"best: {_label(b)}, {len(b.schedule.rounds)} rounds, cycle {1e3 * b.t_cycle:.1f} ms, "
          f"sigma2 {b.sigma2:.3g}, {b.objective:.3f} /s")
    _print_schedule(topo, model, b)
    from ..schedule.hwparams import job_shape
    window, elements = job_shape()
    args.out.mkdir(parents=True, exist_ok=True)
    js, png = args.out / "schedule.json", args.out / "schedule.png"
    write_schedule_json(js, schedule_json(topo, net, b, model, window=window,
                                          elements=elements, note=note))
    print(f"wrote {js}")
    if args.plot:
        from ..schedule.plot import plot_rounds
        plot_rounds(topo, b, png)
        print(f"wrote {png}")
    return 0


def _sweep(args):
    from ..cli import CliError
    from ina_fabric.bench.experiments.schedule import memory_sweep, DEFAULT_SWEEP, family_order
    from ..schedule.hwparams import default_memory
    import json
    args.memory = None
    topo, net, note = _setup(args)
    try:
        mems = [parse_size(x) for x in args.memories.split(",")] if args.memories else \
            sorted(set(DEFAULT_SWEEP + [default_memory()[0]]))
    except ValueError as e:
        raise CliError(str(e)) from None
    print(f"{topo.n} islands ({topo.source}); S = {net.update_bytes:.4g} B; "
          f"jitter {net.jitter_s * 1e6:g} us; default M: {note}")
    head = None

    def show(r):
        nonlocal head
        fams = sorted(r["per_family"], key=family_order)
        if head is None:
            head = fams
            print(f"{'M bytes':>10s} {'best':>14s} {'R':>2s} {'T_cyc ms':>9s} " +
                  " ".join(f"{f.replace('cliques-', 'k=').replace('static-', ''):>8s}"
                           for f in fams))
        print(f"{r['memory_bytes']:10.3g} {r['best']:>14s} {r['rounds']:2d} "
              f"{1e3 * r['t_cycle_s']:9.1f} " +
              " ".join(f"{r['per_family'].get(f, 0):8.3f}" for f in head), flush=True)
    rows = memory_sweep(topo, net, mems, seed=args.seed, time_budget_s=args.time_budget,
                        progress=show)
    args.out.mkdir(parents=True, exist_ok=True)
    png, js = args.out / "sweep_memory.png", args.out / "sweep_memory.json"
    with open(js, "w") as fh:
        json.dump(rows, fh, indent=1)
    print(f"(columns after T_cyc: best -log sigma2 / T_cycle per family, 1/s)\n"
          f"wrote {js}")
    if args.plot:
        from ..schedule.plot import plot_sweep
        plot_sweep(rows, png)
        print(f"wrote {png}")
    return 0


def _simulate(args):
    from ..schedule.search import optimize
    from ..schedule.model import RoundModel
    from ..schedule.simulate import simulate_schedule
    topo, net, note = _setup(args)
    model = RoundModel(topo, net)
    res = optimize(topo, net, seed=args.seed, time_budget_s=args.time_budget, model=model)
    b = res.best
    chunks = args.chunks or int(min(65536, max(512, 200 * net.update_bytes /
                                             max(net.memory_bytes, 1.0))))
    print(f"best: {_label(b)}, {len(b.schedule.rounds)} rounds; {note}; {chunks} chunks/update "
          f"(buffer measured to +-1 chunk = {net.update_bytes / chunks:.4g} B)")
    worst = 0.0
    for r, sim in enumerate(simulate_schedule(model, b.schedule, chunks, args.seed)):
        peak = max(sim.peak_buffer.values(), default=0.0)
        print(f"  round {r + 1}: predicted {1e3 * sim.predicted:9.2f} ms  simulated "
              f"{1e3 * sim.time:9.2f} ms  error {100 * sim.error:5.2f}%  peak FPGA buffer "
              f"{peak:.4g} B of {net.memory_bytes:.4g}  overflows {sim.overflows}")
        worst = max(worst, sim.error)
    ok = worst <= 0.10
    print(f"agreement: worst error {100 * worst:.2f}% ({'within' if ok else 'OUTSIDE'} 10%)")
    return 0 if ok else 1


def _train(args):
    from ina_fabric.bench.experiments.schedule import training_comparison
    from ..schedule.train import IslandTrainConfig
    import json
    topo, net, note = _setup(args)
    cfg = IslandTrainConfig(rounds=args.rounds, local_steps=args.local_steps,
                      compute_s=args.compute_s, seed=args.seed)
    out = training_comparison(topo, net, cfg, seed=args.seed, time_budget_s=args.time_budget)
    print(f"{topo.n} islands; S = {net.update_bytes:.4g} B; {note}; compute "
          f"{cfg.compute_s} s/round; target loss {out['target_loss']:.4f} "
          f"(colocated at round {cfg.rounds // 2})")
    print(f"{'method':58s} {'comm/round':>10s} {'to target':>10s} {'gap':>6s} {'test acc':>8s}")
    for r in out["rows"]:
        print(f"{r['method']:58s} {1e3 * r['comm_s_per_round']:8.1f}ms "
              f"{r['time_to_target_s']:9.1f}s {r['gap_vs_colocated']:5.2f}x "
              f"{r['final_test_acc']:8.3f}")
    args.out.mkdir(parents=True, exist_ok=True)
    js, png = args.out / "schedule_train.json", args.out / "schedule_train.png"
    with open(js, "w") as fh:
        json.dump({"target_loss": out["target_loss"], "rows": out["rows"]}, fh, indent=1,
                  default=str)
    print(f"wrote {js}")
    if args.plot:
        from ..schedule.plot import plot_training
        plot_training(out["traces"], out["target_loss"], png)
        print(f"wrote {png}")
    return 0


def _topology(args):
    topo, _, _ = _setup(args, need_memory=False)
    print(topo.describe())
    w = max(len(x) for x in topo.names)
    print("RTT ms".rjust(w) + " " + " ".join(f"{x[:7]:>7s}" for x in topo.names))
    for i, nm in enumerate(topo.names):
        print(f"{nm:>{w}s} " + " ".join(f"{2e3 * topo.latency[i, j]:7.1f}" for j in range(topo.n)))
    return 0


def run(args):
    from ._common import require_extras
    if getattr(args, "plot", False):
        require_extras("plot", what="--plot")
    return {"optimize": _optimize, "sweep-memory": _sweep, "simulate": _simulate,
            "train": _train, "topology": _topology}[args.action](args)
