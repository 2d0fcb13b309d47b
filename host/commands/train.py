"""Train a real model with N local workers, gradients aggregated through the software
switch (started here) or a switch you name, and the same run on Gloo as the baseline.

    ina train                                   digits CNN, 4 workers: ina vs Gloo
    ina train --backends ina,ina-bounded,gloo --loss 0.02 --plot
    ina train --workload transformer --max-epochs 3
    ina train --switch 198.18.0.10:19900         aggregate on an FPGA board
    ina train --engine rtl --backends ina        through the gateware in Verilator, the
                                                 model beside it as a live scoreboard
    ina train --engine board --backends ina      through the whole board's datapath in
                                                 Verilator on a TAP (root; make demo-board)
    ina train --lab rack --lab-set rate=100mbit  one torchrun per host namespace of a
                                                 rack lab (root; see docs/lab.md)
    ina train --lab fabric --workers 8 --lab-set hosts_per_rack=4
                                                 2 racks under a spine, a tree of switches

Results go to --out DIR (default ina-out/train): results.json, and accuracy.png with
--plot.

Under torchrun (multi-node), use host.ddp.hook.InaHookState.from_env in your script
(see docs/design.md, "Train with torchrun").
"""

import sys

HELP = "train with aggregation offloaded to a switch, against Gloo on the same seeds"


def add_arguments(p):
    from ina_fabric.protocol.jobtable import LINK_DEFAULTS
    from ._common import (add_impairment_arguments, add_output_arguments,
                          add_switch_argument)
    lo, eth = LINK_DEFAULTS["loopback"], LINK_DEFAULTS["ethernet"]
    p.add_argument("--workload", default="digits", choices=("digits", "digits-mlp", "transformer"),
                   help="what to train")
    p.add_argument("--workers", type=int, default=4, help="local ranks (1..32)")
    p.add_argument("--backends", default="ina,gloo",
                   help="comma-separated runs: ina, ina-bounded, ina-skip (bounded, a "
                        "straggler skipped after one deadline), ina-skip-carry, gloo, or "
                        "module:factory")
    p.add_argument("--target", type=float, help="test accuracy to reach (default: the "
                   "workload's: 0.95 for digits)")
    p.add_argument("--max-epochs", type=int, default=60, help="stop after this many epochs")
    p.add_argument("--seed", type=int, default=0, help="model, data and impairment seed")
    p.add_argument("--lr", type=float, help="learning rate (default: the workload's)")
    p.add_argument("--batch", type=int, help="per-worker batch (default: the workload's)")
    p.add_argument("--accum-steps", type=int, default=1,
                   help="micro-batches per optimizer step")
    add_switch_argument(p)
    p.add_argument("--lab", metavar="TOPOLOGY",
                   help="run every backend in a lab built from TOPOLOGY (rack, fabric): one "
                        "torchrun per host namespace, ina switch in the switch namespace "
                        "(fabric: the racks' switches under the spine's, a tree), Gloo on "
                        "the same links (root; the lab is removed afterwards)")
    p.add_argument("--lab-set", action="append", default=[], metavar="NAME=VALUE",
                   help="a lab topology parameter (repeatable; default hosts = --workers, "
                        "mtu = 9000; fabric: hosts_per_rack (default 4) and racks with "
                        "racks x hosts_per_rack = --workers)")
    p.add_argument("--engine", choices=("auto", "fast", "model", "rtl", "board"),
                   default="auto",
                   help="the switch started here (as `ina switch --engine`): rtl runs the "
                        "gateware (hw/ina) in Verilator with the reference model as a live "
                        "scoreboard; board runs the Versa board's whole datapath in "
                        "Verilator on a TAP in a namespace of its own, the workers in that "
                        "namespace reaching it through the kernel (root); both default the "
                        "job to the core's window and elements per packet")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="give up on a run after this long (default 1800; 7200 with "
                        "--engine board, whose digits run takes tens of minutes under load)")
    p.add_argument("--static-job", action="store_true",
                   help="the switch already holds the job (an FPGA loaded with `ina "
                        "hw-config`): send no CONTROL, bind worker r to --base-port + r")
    from ._common import add_session_argument
    add_session_argument(p, "with --static-job: the session id of the job the switch "
                            "holds (the `session` of its [[job]] table)")
    p.add_argument("--base-port", "--worker-base-port", dest="base_port", type=int,
                   default=0, metavar="PORT",
                   help="worker r binds PORT+r (0: ephemeral ports)")
    g = p.add_argument_group("job settings")
    g.add_argument("--elements", type=int,
                   help=f"elements per packet (default: {lo.elements} on loopback, "
                        f"{eth.elements} with --switch, which fits a 1500-byte Ethernet MTU)")
    g.add_argument("--window", type=int,
                   help=f"slots in flight per job (default: {lo.window}; with --engine rtl "
                        f"the core's window)")
    g.add_argument("--deadline-ms", type=float, default=lo.deadline_ms,
                   help="bounded-mode deadline")
    p.add_argument("--fallback", choices=("gloo", "never"),
                   help="a switch this run cannot use at setup: every rank falls back to "
                        "Gloo together, with a warning on every rank and in the table "
                        "(gloo), or every rank stops with the reason (never); default: "
                        "INA_FALLBACK, else never with --static-job (the run was meant "
                        "for that switch) and gloo otherwise")
    add_impairment_arguments(p)
    add_output_arguments(p, "train")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args):
    from ._common import require_extras
    require_extras("torch")
    if args.plot:
        require_extras("plot", what="--plot")
    run_timeout(args)           # (a bad --timeout: one line before anything starts)
    switch = f"{args.switch[0]}:{args.switch[1]}" if args.switch else None
    link = "ethernet" if args.switch else "loopback"
    lab = None
    if args.lab:
        lab, switch, lab_elements = _lab_up(args)
        args.elements = args.elements or lab_elements
    try:
        return _train(args, switch, link, lab)
    finally:
        if lab is not None:
            lab.down()


def _lab_up(args):
    """The lab for --lab: hosts = --workers and jumbo frames unless set; its switch."""
    from ..cli import CliError
    from ..lab import LabError, TopologyError, available, training_lab
    why = available()
    if why:
        raise CliError(f"--lab: {why}")
    sets = dict(kv.partition("=")[::2] for kv in args.lab_set)
    try:
        lab, switch, elements = training_lab(args.lab, args.workers, sets)
    except (LabError, TopologyError, ValueError) as e:
        raise CliError(f"--lab {args.lab}: {e}") from None
    print(f"lab {lab.id}: {lab.topo.name}, {len(lab.topo.hosts)} hosts, "
          f"{elements} elements per packet, switch {switch}", file=sys.stderr)
    return lab, switch, elements


#: how long a run may take, per engine (``--timeout`` overrides): a run through the
#: board engine is simulated RTL, minutes per epoch on a loaded machine
RUN_TIMEOUT_S = {"board": 7200.0}


def run_timeout(args) -> float:
    """``--timeout``, else the engine's default (``RUN_TIMEOUT_S``, else 1800 s)."""
    from ..cli import CliError
    if args.timeout is not None:
        if not args.timeout > 0:
            raise CliError(f"--timeout {args.timeout:g}: must be > 0 seconds")
        return args.timeout
    return RUN_TIMEOUT_S.get(args.engine, 1800.0)


def _train(args, switch, link, lab):
    import json
    import sys
    from tqdm import tqdm
    from ..cli import CliError
    from ..ddp.train import TrainConfig, run_training, run_training_lab
    from ina_fabric.protocol.jobtable import job_defaults
    runs = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not runs:
        raise CliError("--backends is empty")
    from ina_fabric.protocol.jobtable import LINK_DEFAULTS
    lo_window = LINK_DEFAULTS["loopback"].window
    rtl = {}
    if args.engine != "auto" and switch:
        raise CliError("--engine chooses the switch started here; not with --switch/--lab")
    if args.engine == "rtl":
        from ..switch.rtl import rtl_params, why_not
        why = why_not()
        if why:
            raise CliError(f"--engine rtl: {why}")
        try:
            P = rtl_params()
        except ValueError as e:
            raise CliError(f"--engine rtl: {e}") from None
        rtl = {"window": P.window, "elements": P.elements}
    if args.engine == "board":
        from ..switch.board import board_params, why_not
        from ..lab.netns import available
        why = why_not() or available()
        if why:
            raise CliError(f"--engine board: {why}")
        P = board_params()
        rtl = {"window": P.window, "elements": P.elements}
    results = {}
    for backend in runs:
        cfg = TrainConfig(workload=args.workload, workers=args.workers, backend=backend,
                          target=args.target, max_epochs=args.max_epochs, seed=args.seed,
                          lr=args.lr, batch=args.batch, accum_steps=args.accum_steps,
                          switch=switch, switch_engine=args.engine,
                          window=(args.window if args.window is not None
                                  else rtl.get("window", lo_window)),
                          static_job=args.static_job, worker_base_port=args.base_port,
                          session=args.session or 0, fallback=args.fallback,
                          elements=args.elements or rtl.get("elements")
                          or job_defaults(link).elements,
                          deadline_ms=args.deadline_ms,
                          loss=args.loss if backend.startswith("ina") else 0.0,
                          duplicate=args.duplicate if backend.startswith("ina") else 0.0,
                          reorder=args.reorder if backend.startswith("ina") else 0.0)
        try:
            cfg.validate()
        except ValueError as e:
            raise CliError(str(e)) from None
        print(f"--- {backend}: {args.workload}, {args.workers} workers, seed {args.seed}"
              + (f", lab {args.lab}" if lab is not None else "")
              + (f", loss {cfg.loss:g}" if cfg.loss else ""), file=sys.stderr, flush=True)
        from ina_fabric.host.ddp.workloads import TARGETS
        target = args.target or TARGETS[args.workload]
        bar = tqdm(total=args.max_epochs, desc=f"{backend} (to acc {target:g})", unit="epoch",
                   file=sys.stderr,
                   disable=args.no_progress, dynamic_ncols=True)

        def progress(kind, payload, bar=bar):
            if kind == "eval":
                t, epoch, step, acc = payload
                bar.n = epoch
                bar.set_postfix(acc=f"{acc:.3f}", t=f"{t:.1f}s")
                bar.refresh()

        try:
            res = run_training(cfg, progress, timeout=run_timeout(args)) if lab is None \
                else run_training_lab(cfg, lab, progress, timeout=run_timeout(args))
        except (RuntimeError, TimeoutError, ValueError) as e:
            bar.close()
            raise CliError(f"{backend} run failed: {e}") from None
        bar.close()
        results[backend] = res
    _report(results, args)
    args.out.mkdir(parents=True, exist_ok=True)
    from dataclasses import asdict
    js = args.out / "results.json"      # the results first: a figure never loses them
    with open(js, "w") as fh:
        json.dump({k: {kk: vv for kk, vv in asdict(v).items() if kk != "params"}
                   for k, v in results.items()}, fh, indent=2, default=str)
    print(f"wrote {js}")
    if args.plot:
        _plot(results, args, args.out / "accuracy.png")
    ok = all(r.time_to_accuracy is not None for r in results.values())
    return 0 if ok else 1


def _ratio(r, base):
    """(time-to-accuracy ratio or None, seconds-per-step ratio or None) against Gloo."""
    tta = step = None
    if base is not None and base.time_to_accuracy and r.time_to_accuracy:
        tta = r.time_to_accuracy / base.time_to_accuracy
    if base is not None and base.steps and r.steps and base.seconds:
        step = (r.seconds / r.steps) / (base.seconds / base.steps)
    return tta, step


def _report(results, args):
    base = results.get("gloo")
    print()
    print(f"{'run':14s} {'time-to-acc':>12s} {'vs gloo':>8s} {'s/step':>8s} {'vs gloo':>8s} "
          f"{'final acc':>9s} {'steps':>6s} {'packets':>8s} {'retrans':>8s} {'partial':>8s} "
          f"{'lost':>8s} {'replicas':>9s}")
    for name, r in results.items():
        tta = f"{r.time_to_accuracy:.1f}s" if r.time_to_accuracy is not None else "not reached"
        ratio, step_ratio = _ratio(r, base)
        ratio = f"{ratio:.2f}x" if ratio is not None else "-"
        step_ratio = f"{step_ratio:.2f}x" if step_ratio is not None else "-"
        per_step = f"{r.seconds / r.steps * 1e3:.1f}ms" if r.steps else "-"
        s = r.stats or {}
        same = "identical" if len(set(r.param_hashes)) == 1 else "DIVERGED"
        print(f"{name:14s} {tta:>12s} {ratio:>8s} {per_step:>8s} {step_ratio:>8s} "
              f"{r.final_accuracy:9.3f} {r.steps:6d} "
              f"{s.get('packets_sent', '-'):>8} {s.get('retransmits', '-'):>8} "
              f"{s.get('partial_slots', '-'):>8} {s.get('entries_lost', '-'):>8} {same:>9s}")
        rejoined = [d.get("rejoins", 0) for d in r.rejoin]
        if any(rejoined):
            share = s.get("entries_lost", 0) / max(1, s.get("elements", 0))
            print(f"  {name}: rank(s) {', '.join(str(k) for k, n in enumerate(rejoined) if n)}"
                  f" fell more than a window behind and rejoined from a peer's replica "
                  f"({sum(rejoined)} time(s), "
                  f"{sum(d.get('steps_skipped', 0) for d in r.rejoin)} step(s) taken "
                  f"without the switch); dropped share {share:.1%} of rank 0's entries")
        if r.fallbacks:
            print(f"  WARNING {name}: the switch could not be used; {r.fallbacks} of "
                  f"{len(r.param_hashes)} ranks fell back to Gloo together (this row "
                  f"measures Gloo; --fallback never stops instead)")
    for name, r in results.items():
        _report_rtl(name, r.switch_rtl)
        _report_board(name, r.switch_board)
    print("time-to-acc: wall time from the first step to the first epoch whose test "
          "accuracy reached the target; vs gloo: this run's time / Gloo's (time-to-acc, and "
          "wall time per optimizer step, which is there even when a run missed the target); "
          "stats are rank 0's (lost = entries that came from fewer than N workers)")


def _report_rtl(name, rtl):
    """The RTL engine's figures and the core's counters (read from its registers)."""
    if not rtl:
        return
    print(f"{name}: through the RTL core (Verilator): {rtl['cycles']:,} cycles, "
          f"{rtl['datagrams_in']:,} datagrams in, {rtl['datagrams_out']:,} out; "
          f"{rtl['cycles_per_packet']} cycles/packet (ideal {rtl['ideal_cycles_per_packet']}, "
          f"{rtl['stall_cycles']} stall cycles); {rtl['cycles_per_second'] or 0:,} cycles/s "
          f"simulated; scoreboard disagreements: {rtl['disagreements']}")
    counters = rtl.get("counters") or {}
    print("  core counters: " + ", ".join(f"{k} {v:,}" for k, v in counters.items() if v))


def _report_board(name, b):
    """The board engine's figures: frames, simulated time and its ratio, core counters."""
    if not b:
        return
    ratio = b.get("sim_time_ratio") or 0.0
    print(f"{name}: through the board (Verilator, TAP): {b['p0_rx_frames']:,} frames in, "
          f"{b['p0_tx_frames']:,} out ({b['p0_tx_bad_fcs']} with a bad FCS); "
          f"{b['simulated_s'] * 1e3:.1f} ms simulated in {b['simulating_wall_s']:.1f} s of "
          f"simulating ({ratio:.2e} of real time)")
    print("  core counters: " + ", ".join(f"{k} {v:,}" for k, v in
                                          (b.get("core") or {}).items() if v))
    print("  port 0: " + ", ".join(f"{k} {v:,}" for k, v in (b.get("port0") or {}).items()))


def _plot(results, args, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, r in results.items():
        if r.curve:
            t = [c[0] for c in r.curve]
            a = [c[3] for c in r.curve]
            ax.plot(t, a, marker=".", label=name)
    target = next(iter(results.values())).config.get("target")
    if target is None:
        from ina_fabric.host.ddp.workloads import TARGETS
        target = TARGETS.get(args.workload)
    if target:
        ax.axhline(target, color="gray", ls="--", lw=0.8, label=f"target {target:g}")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{args.workload}, {args.workers} workers")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")
