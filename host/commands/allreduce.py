"""Smoke test and quick measurement: N local workers allreduce random vectors through a
switch and check the sum against float64 numpy.

    ina allreduce                              (starts its own software switch)
    ina allreduce --workers 4 --size 4M --loss 0.02 --mode bounded
    ina allreduce --switch 10.0.0.10:19900 ...  (an FPGA or a remote ina switch)
"""

HELP = "allreduce through a switch with N local workers; prints throughput and stats"


def parse_size(text: str) -> int:
    from ..cli import CliError
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower()
    try:
        if t and t[-1] in mult:
            return int(float(t[:-1]) * mult[t[-1]])
        return int(t)
    except ValueError:
        raise CliError(f"bad size {text!r}: use e.g. 65536, 256k, 4M") from None


def add_arguments(p):
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--size", default="1M", help="float32 elements per worker (e.g. 4M)")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--mode", choices=("reliable", "bounded"), default="reliable")
    p.add_argument("--elements", type=int, help="elements per packet (default: 8192 on "
                   "loopback, 256 with --switch)")
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--deadline-ms", type=float, default=5.0)
    p.add_argument("--loss", type=float, default=0.0, help="uplink loss probability")
    p.add_argument("--duplicate", type=float, default=0.0)
    p.add_argument("--reorder", type=float, default=0.0)
    p.add_argument("--switch", metavar="IP:PORT",
                   help="use this switch instead of starting a local one "
                        "(it must have the job configured)")
    p.add_argument("--job", type=int, default=1)
    p.add_argument("--base-port", type=int, default=20000)
    p.add_argument("--seed", type=int, default=0)


def run(args):
    import json
    from ..cli import CliError
    from ..cluster import LocalCluster, WorkerSpec
    n = parse_size(args.size)
    if not 1 <= args.workers <= 32:
        raise CliError("--workers must be in 1..32")
    spec = WorkerSpec(job=args.job, nworkers=args.workers, window=args.window,
                      elements=args.elements or (256 if args.switch else 8192),
                      mode=args.mode,
                      deadline=args.deadline_ms / 1e3, base_port=args.base_port,
                      loss=args.loss, duplicate=args.duplicate, reorder=args.reorder,
                      seed=args.seed)
    try:
        with LocalCluster(spec, switch=args.switch) as cluster:
            res = cluster.allreduce_check(n, args.iterations)
    except (OSError, ValueError) as e:
        raise CliError(str(e)) from None
    gbps = 8 * 4 * n * args.iterations / res["seconds"] / 1e9
    print(f"{args.workers} workers x {n} float32, {args.iterations} iterations, {args.mode}: "
          f"{res['seconds'] / args.iterations * 1e3:.1f} ms per allreduce, "
          f"{gbps:.2f} Gb/s per worker")
    print(f"max |error| {res['max_error']:.3g}; worst error / quantization bound = "
          f"{res['bound_ratio']:.3f} (must be <= 1)")
    print(f"worker 0 stats: {json.dumps(res['stats'])}")
    if res["switch_counters"]:
        print(f"switch: {json.dumps(res['switch_counters'])}")
    if not res["within_bound"] and args.mode == "reliable":
        print("ERROR: result outside the quantization bound", flush=True)
        return 1
    return 0
