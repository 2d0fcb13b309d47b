"""Joint vs decoupled control of precision and accumulation: time to target, side by side.

    ina bench control                          simulation at paper scale + knob trace PNGs
    ina bench control --real                   also real training (digits, 4 workers, throttled)
    ina bench control --lab                    only the lab comparison: charlm on a 4-host
                                               lab beside background jobs, progress model
                                               fitted from real curves, 3 seeds
                                               (control_real.json, control_real_lab.png)
    ina bench control --lab --lab-path switch  the same with our gradients summed in the lab's
                                               switch (rows with path "switch" are added
                                               beside the Gloo path's in control_real.json)
    ina bench control --plot 'X_{link}.png' where the knob trace PNGs go
    ina bench control --rate-price 2          lambda of the pace-knob comparison (0: skip it)

Figures are ratios of time to target (other controller / Joint) measured in one run.
"""

import argparse
import pathlib
import sys


def main(argv=None) -> int:
    from ina_fabric.bench import _results
    from ina_fabric.bench.experiments.experiments import (RATE_PRICE, real_comparison, real_trace,
                                                     sim_comparison, sim_pace_comparison,
                                                     trace_figure)
    ap = argparse.ArgumentParser(prog="ina bench control", description=__doc__.strip().splitlines()[0])
    ap.add_argument("--real", action="store_true", help="also run the real-training comparison")
    ap.add_argument("--real-levels", default="light,heavy")
    ap.add_argument("--plot", default=str(_results.RESULTS / "control_trace_{link}.png"),
                    help="knob trace PNG; {link} becomes 10G and 100G")
    ap.add_argument("--real-plot", default=str(_results.RESULTS / "control_real.png"))
    ap.add_argument("--real-trace", default=str(_results.RESULTS / "control_real_trace.png"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate-price", type=float, default=None, metavar="LAMBDA",
                    help="price of holding a whole link per second, relative to the job's "
                         "workers, for the simulated pace-knob comparison (default 2; 0 "
                         "skips it); with --lab, the lab runs' objective (default 0)")
    ap.add_argument("--paces", default="1,0.5,0.25",
                    help="pace choices (fractions of the link) when the objective prices "
                         "the link (--rate-price > 0)")
    ap.add_argument("--lab", action="store_true",
                    help="run only the lab comparison (needs root; about 40 minutes)")
    ap.add_argument("--lab-levels", default="light,heavy")
    ap.add_argument("--lab-seeds", type=int, default=3, help="seeds per level (>= 2)")
    ap.add_argument("--lab-rate", default="50mbit",
                    help="every host link's rate, each way, as tc writes it (default "
                         "50mbit); recorded in control_real.json's setup and rows")
    ap.add_argument("--lab-id", default="ctl", help="lab id (unique on this machine)")
    ap.add_argument("--lab-micro-batch", type=int, default=8,
                    help="charlm sequences per worker per micro-step")
    ap.add_argument("--lab-exchange", choices=("ring", "direct"), default="ring",
                    help="how our messages travel: Gloo's ring all-gather, or to every "
                         "peer at once (one trip through the queues instead of N-1)")
    ap.add_argument("--lab-path", choices=("gloo", "switch"), default="gloo",
                    help="where our gradients are summed: all-gathered over Gloo "
                         "(--lab-exchange), or in the lab's ina switch, the precision knob "
                         "setting the bits per element on the wire")
    ap.add_argument("--lab-pace-ab", type=float, metavar="PACE",
                    help="run only an A/B on the lab: fixed knobs int4/a=4, unpaced against "
                         "paced at PACE, interleaved, --lab-levels x --lab-seeds "
                         "(control_pace_ab.json; about 12 minutes)")
    ap.add_argument("--lab-plot", default=str(_results.RESULTS / "control_real_lab.png"))
    ap.add_argument("--lab-analyze", metavar="RAW_JSON",
                    help="run nothing: redo the analysis (fit, check, statistics, "
                         "simulation, plot) of a previous run's control_real_raw.json")
    ap.add_argument("--lab-fit-from", metavar="RAW_JSON",
                    help="reuse the fitting runs saved in a previous run's "
                         "control_real_raw.json instead of running them again")
    args = ap.parse_args(argv)
    try:
        args.paces = tuple(float(x) for x in args.paces.split(",") if x.strip())
        from ina_fabric.host.controller.knobs import KnobSpace
        KnobSpace(paces=args.paces)           # 1 (unpaced, the default) must be there
    except ValueError as e:
        print(f"ina bench control: --paces {args.paces!r}: {e}", file=sys.stderr)
        return 2
    if args.rate_price is not None and not args.rate_price >= 0:
        print(f"ina bench control: --rate-price {args.rate_price!r}: must be >= 0",
              file=sys.stderr)
        return 2
    _results.RESULTS.mkdir(parents=True, exist_ok=True)
    if args.lab or args.lab_analyze or args.lab_pace_ab is not None:
        return _lab(args, _results)
    figures = sim_comparison(seed=args.seed)
    price = RATE_PRICE if args.rate_price is None else args.rate_price
    if price > 0:
        figures.update(sim_pace_comparison(seed=args.seed, rate_price=price,
                                           paces=args.paces))
    for link in ("10G", "100G"):
        figures.update(trace_figure(args.plot.format(link=link), link=link, seed=args.seed))
    if args.real:
        figures.update(real_comparison(levels=tuple(args.real_levels.split(",")),
                                       seed=args.seed, plot=args.real_plot))
        figures.update(real_trace(args.real_trace, seed=args.seed))
    print("\nheadline: decoupled / joint time to target: " + ", ".join(
        f"{k.split('_')[1]} {k.split('_')[2]} {v:.2f}x" for k, v in figures.items()
        if k.endswith("_decoupled_over_joint") and k.startswith("sim_")))
    _results.write("control", figures)
    return 0


def _lab(args, _results):
    from ina_fabric.bench.experiments.labexp import lab_experiment
    from ina_fabric.bench.experiments.labrun import LAB_LEVELS, LabSetup
    from ina_fabric.host.lab import available
    levels = tuple(x for x in args.lab_levels.split(",") if x)
    bad = [x for x in levels if x not in LAB_LEVELS]
    if bad or not levels:
        print(f"ina bench control: --lab-levels {args.lab_levels!r}: choose from "
              f"{', '.join(LAB_LEVELS)}", file=sys.stderr)
        return 2
    if args.lab_seeds < 2:
        print("ina bench control: --lab-seeds must be >= 2 (a confidence interval)",
              file=sys.stderr)
        return 2
    if args.lab_micro_batch < 1:
        print("ina bench control: --lab-micro-batch must be >= 1", file=sys.stderr)
        return 2
    price = args.rate_price or 0.0
    setup = LabSetup(rate=args.lab_rate, lab_id=args.lab_id, micro_batch=args.lab_micro_batch,
                     exchange=args.lab_exchange, rate_price=price,
                     paces=args.paces if price > 0 else (1.0,), path=args.lab_path)
    if args.lab_path == "switch" and price > 0:
        print("ina bench control: --lab-path switch has no pace knob (--rate-price 0)",
              file=sys.stderr)
        return 2
    if args.lab_analyze:
        import json
        from ina_fabric.bench.experiments.labexp import TARGET_LOSS, analyze
        try:
            with open(args.lab_analyze) as f:
                raw = json.load(f)
        except (OSError, ValueError) as e:
            print(f"ina bench control: --lab-analyze: {e}", file=sys.stderr)
            return 2
        raw.setdefault("target_loss", TARGET_LOSS)
        raw.setdefault("levels", list(levels))
        raw.setdefault("seeds", sorted({r["seed"] for r in raw["lab_runs"]}))
        raw.setdefault("setup", {k: v for k, v in setup.__dict__.items() if k != "extra"})
        # the run's own setup where it was saved (micro-batch, exchange, rate, ...)
        saved = {k: v for k, v in raw["setup"].items() if k in LabSetup.__dataclass_fields__}
        setup = LabSetup(**{**setup.__dict__, **saved, "lab_id": setup.lab_id})
        figures = analyze(raw, setup, plot=args.lab_plot)
        _write_real(_results, figures, setup.path)
        return 0
    why = available()
    if why:
        print(f"ina bench control: the lab is not available here: {why}", file=sys.stderr)
        return 2
    if args.lab_pace_ab is not None:
        from ina_fabric.host.controller.knobs import ConfigError, Knobs
        from ina_fabric.bench.experiments.labexp import pace_ab
        try:
            Knobs(4, 4, args.lab_pace_ab)
        except ConfigError as e:
            print(f"ina bench control: --lab-pace-ab: {e}", file=sys.stderr)
            return 2
        figures = pace_ab(setup, levels, tuple(range(args.seed, args.seed + args.lab_seeds)),
                          pace=args.lab_pace_ab)
        _results.write("control_pace_ab", figures)
        return 0
    figures = lab_experiment(setup, levels, tuple(range(args.seed, args.seed + args.lab_seeds)),
                             plot=args.lab_plot,
                             raw_path=str(_results.RESULTS / "control_real_raw.json"),
                             fit_from=args.lab_fit_from)
    _write_real(_results, figures, setup.path)
    return 0


def _write_real(_results, figures, path):
    """control_real.json: this run's figures, and ``rows``, one per (path, level, rate)
    with ``path``, ``level``, ``rate`` (every host link's, from the run's setup),
    ``decoupled_over_joint``, ``ci95_low``, ``ci95_high``, ``seeds`` (and the fitted
    simulator's ratio at the run's setting, and on the switch path the setting it
    predicts best, ``sim_best_setting``). The rows in the file before are kept but for
    those of the same path, level and rate, which this run's replace: a switch-path run
    adds its rows beside the Gloo path's, and a run at another rate beside the first."""
    import json
    rate = figures.get("setup", {}).get("rate")
    rows = [{"path": path, "level": level, "rate": rate, "seeds": v["seeds"],
             "decoupled_over_joint": v["decoupled_over_joint"], "ci95_low": v["ci95_low"],
             "ci95_high": v["ci95_high"], "verdict": v["verdict"],
             "sim_decoupled_over_joint": v.get("sim_decoupled_over_joint"),
             **({"sim_best_setting": v["sim_best_setting"]} if "sim_best_setting" in v
                else {})}
            for level, v in figures.get("levels", {}).items()]
    old = _results.RESULTS / "control_real.json"
    try:
        prev = json.loads(old.read_text())["figures"]
    except (OSError, ValueError, KeyError):
        prev = {}
    prev_setup = prev.get("setup", {})
    kept = prev.get("rows", [])
    if not kept and prev.get("levels"):                 # a file from before the rows
        kept = [{"path": prev_setup.get("path", "gloo"), "level": lv,
                 **{k: v[k] for k in ("decoupled_over_joint", "ci95_low", "ci95_high",
                                      "seeds")}}
                for lv, v in prev["levels"].items()]
    # a row from before the rates were recorded: the rate of the run that wrote the
    # file, where the row is of that run's path (else unknown)
    kept = [{**r, "rate": r.get("rate", prev_setup.get("rate") if r.get("path", "gloo")
                                 == prev_setup.get("path", "gloo") else None)}
            for r in kept]
    new = {(r["path"], r["level"], r["rate"]) for r in rows}
    kept = [r for r in kept if (r.get("path", "gloo"), r["level"], r["rate"]) not in new]
    figures["path"] = path
    figures["rows"] = kept + rows
    for r in figures["rows"]:
        sim, best = r.get("sim_decoupled_over_joint"), r.get("sim_best_setting")
        print(f"   {r['path']:6s} {r['level']:6s} {r['rate'] or '?':>8s} decoupled / joint "
              f"{r['decoupled_over_joint']:.3f}x [{r['ci95_low']:.3f}, {r['ci95_high']:.3f}]"
              f" over {r['seeds']} seeds"
              + (f"; fitted simulator at this setting {sim:.3f}x" if sim is not None else "")
              + (f", its best setting {best['rate']} at {best['latency_s']:.3f} s per "
                 f"exchange: {best['sim_decoupled_over_joint']:.3f}x" if best else ""))
    _results.write("control_real", figures)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
