"""Joint network/ML controller: gradient precision, pace and accumulation chosen together.

    ina control model --bandwidth 1.25e9 --b-noise 256     predicted time to target per knob pair
    ina control model --rate-price 2                        ... with the pace knob, cost to target
    ina control simulate                                    paper-scale simulation, 5 controllers
    ina control simulate --rate-price 2                     ... with the pace knob (cost to target)
    ina control trace --link 10G                          knobs vs time, changing contention
    ina control real --levels light,heavy --plot          real training (digits, 4 workers)

Figures go to --out DIR (default ina-out/control): trace_<link>.png, real.png.
    ina control kappa --workload transformer --steps 30    kappa2 of real gradients

See docs/control.md.
"""

HELP = "joint precision/pace/accumulation controller: cost model, simulation, real runs"


def add_arguments(p):
    from ._common import add_output_arguments
    sub = p.add_subparsers(dest="what", required=True, metavar="WHAT")
    m = sub.add_parser("model", help="print predicted time to target for every knob pair")
    m.add_argument("--params", type=int, default=774_000_000)
    m.add_argument("--workers", type=int, default=8)
    m.add_argument("--micro-batch", type=int, default=8)
    m.add_argument("--t-compute", type=float, default=0.27, help="seconds per micro-step")
    m.add_argument("--bandwidth", type=float, default=12.5e9, help="bytes/s")
    m.add_argument("--b-noise", type=float, default=256.0)
    m.add_argument("--overlap", type=float, default=0.5)
    m.add_argument("--kappa2", type=float, default=30.0)
    m.add_argument("--precisions", default="32,16,8,4")
    m.add_argument("--accums", default="1,2,4,8,16")
    m.add_argument("--rate-price", type=float, default=0.0, metavar="LAMBDA",
                   help="price of holding the whole link per second, relative to the "
                        "workers (0: time to target, no pace knob)")
    m.add_argument("--paces", default="1,0.5,0.25",
                   help="pace choices, shares of the link (with --rate-price > 0)")
    m.add_argument("--link-rate", type=float, default=None,
                   help="bytes/s of a worker's link, the pace's reference (default: "
                        "--bandwidth)")
    s = sub.add_parser("simulate", help="simulated time to target, five controllers")
    s.add_argument("--links", default="100G,10G")
    s.add_argument("--levels", default="light,medium,heavy")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--rate-price", type=float, default=0.0, metavar="LAMBDA",
                   help="> 0: the pace knob's comparison (cost to target) instead")
    s.add_argument("--paces", default="1,0.5,0.25", help="pace choices (with --rate-price)")
    t = sub.add_parser("trace", help="PNG of knobs vs time under changing contention")
    add_output_arguments(t, "control", plot=False)
    t.add_argument("--link", default="10G", choices=["10G", "100G"])
    t.add_argument("--seed", type=int, default=0)
    k = sub.add_parser("kappa", help="measure kappa2 (chunk max^2 / mean square) of real gradients")
    k.add_argument("--workload", default="digits")
    k.add_argument("--steps", type=int, default=60)
    r = sub.add_parser("real", help="real training under a throttled link, five controllers")
    r.add_argument("--levels", default="light,heavy")
    r.add_argument("--controllers", default=None, help="comma list (default: all five)")
    r.add_argument("--workers", type=int, default=4)
    r.add_argument("--capacity", type=float, default=8e6, help="bytes/s per worker link")
    r.add_argument("--workload", default="digits")
    r.add_argument("--seed", type=int, default=0)
    add_output_arguments(r, "control")


def _ints(text, what):
    from ..cli import CliError
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise CliError(f"--{what} {text!r}: expected a comma-separated list of integers")
    return vals


def _paces(text, price):
    from ..cli import CliError
    if not price:
        return (1.0,)
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise CliError(f"--paces {text!r}: expected a comma-separated list of fractions")


def run(args):
    from ..cli import CliError
    from ._common import require_extras
    if args.what in ("kappa", "real"):      # real training: before any work
        require_extras("torch")
    if args.what == "trace":
        require_extras("plot")
    elif getattr(args, "plot", False):
        require_extras("plot", what="--plot")
    from ..controller.knobs import ConfigError
    try:
        if args.what == "model":
            from ..controller.costmodel import CostModel, JobParams
            from ..controller.knobs import Knobs, KnobSpace
            space = KnobSpace(_ints(args.precisions, "precisions"), _ints(args.accums, "accums"),
                              paces=_paces(args.paces, args.rate_price))
            m = CostModel(JobParams(params=args.params, workers=args.workers,
                                    micro_batch=args.micro_batch, t_compute=args.t_compute,
                                    bandwidth=args.bandwidth, b_noise=args.b_noise,
                                    overlap=args.overlap, kappa2=args.kappa2,
                                    link_rate=args.link_rate or 0.0,
                                    rate_price=args.rate_price))
            best = m.cost_to_target(m.best(space.all()))
            what = "cost" if args.rate_price else "time"
            for r in space.paces:
                sp = KnobSpace(space.precisions, space.accums, Knobs(32, 1, r), paces=(r,))
                t = m.table(sp) / best
                print(f"{what} to target relative to the best (rows: bits, columns: "
                      "accumulation)" + (f", pace {r:g}" if args.rate_price else ""))
                print("bits " + "".join(f"{a:>8d}" for a in space.accums))
                for q, row in zip(space.precisions, t):
                    print(f"{q:4d} " + "".join(f"{v:8.2f}" for v in row))
            print(f"best: {m.best(space.all())}")
        elif args.what == "simulate":
            from ina_fabric.bench.experiments.experiments import sim_comparison, sim_pace_comparison
            if args.rate_price:
                sim_pace_comparison(links=tuple(args.links.split(",")),
                                    levels=tuple(args.levels.split(",")), seed=args.seed,
                                    rate_price=args.rate_price,
                                    paces=_paces(args.paces, args.rate_price))
            else:
                sim_comparison(links=tuple(args.links.split(",")),
                               levels=tuple(args.levels.split(",")), seed=args.seed)
        elif args.what == "trace":
            from ina_fabric.bench.experiments.experiments import trace_figure
            args.out.mkdir(parents=True, exist_ok=True)
            png = args.out / f"trace_{args.link}.png"
            trace_figure(str(png), link=args.link, seed=args.seed)
            print(f"wrote {png}")
        elif args.what == "kappa":
            from ina_fabric.bench.experiments.experiments import measure_kappa2
            measure_kappa2(args.workload, steps=args.steps)
        elif args.what == "real":
            from ina_fabric.bench.experiments.experiments import real_comparison
            if args.plot:
                args.out.mkdir(parents=True, exist_ok=True)
            real_comparison(levels=tuple(args.levels.split(",")),
                            controllers=args.controllers.split(",") if args.controllers else None,
                            workers=args.workers, seed=args.seed, capacity=args.capacity,
                            workload=args.workload,
                            plot=str(args.out / "real.png") if args.plot else None)
            if args.plot:
                print(f"wrote {args.out / 'real.png'}")
    except ConfigError as e:
        raise CliError(str(e)) from None
    except KeyError as e:
        raise CliError(f"unknown name {e}") from None
