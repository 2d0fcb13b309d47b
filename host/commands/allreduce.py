"""Smoke test and quick measurement: N local workers allreduce random vectors through a
switch and check the sum against float64 numpy.

    ina allreduce                              (starts its own software switch)
    ina allreduce --workers 4 --size 16M --loss 0.02 --mode bounded
    ina allreduce --switch 198.18.0.10:19900 --elements 256 ...  (an FPGA or a remote switch)

Sizes are bytes (K, M, G are powers of 1024: 4M = 4MB = 4MiB). The job settings default
to the loopback ones; a switch across Ethernet wants --elements 256.
"""

HELP = "allreduce through a switch with N local workers; prints throughput and stats"


def add_arguments(p):
    from ._common import (add_base_port_argument, add_impairment_arguments,
                          add_job_arguments, add_switch_argument, size_arg,
                          add_session_argument)
    p.add_argument("--workers", type=int, default=4, help="local worker processes (1..32)")
    p.add_argument("--size", type=size_arg, default="4M",
                   help="bytes of float32 per worker and call (4M = 1,048,576 floats)")
    p.add_argument("--iterations", type=int, default=3, help="calls, each checked")
    add_job_arguments(p, "loopback")
    add_impairment_arguments(p)
    add_switch_argument(p, "use this switch (an FPGA or a remote `ina switch`; it must "
                           "have the job configured) instead of starting a local one")
    p.add_argument("--job", type=int, default=1, help="job id")
    add_base_port_argument(p)
    add_session_argument(p, "with --switch: the session id of the job it holds (what "
                            "`ina switch` printed, or its [[job]] table's session)")
    p.add_argument("--seed", type=int, default=0, help="data and impairment seed")
    p.add_argument("--precision", "--width", default="32", metavar="P",
                   help="the width on the wire: 32, 16 or 8 (int32, int16, int8), "
                        "optionally :stochastic and/or :hadamard, e.g. 8:stochastic "
                        "(docs/precision.md); every result is checked against its bound")


def run(args):
    import json
    from ..cli import CliError
    from ..cluster import LocalCluster, WorkerSpec
    from ..transport.impair import Impairment
    from ._common import job_settings
    if args.size % 4 or args.size <= 0:
        raise CliError(f"--size {args.size}: a positive number of bytes, a multiple of 4")
    n = args.size // 4
    if not 1 <= args.workers <= 32:
        raise CliError("--workers must be in 1..32")
    from ..transport.precision import Precision
    try:
        precision = Precision.parse(args.precision)
    except ValueError as e:
        raise CliError(f"--precision: {e}") from None
    try:
        spec = WorkerSpec(job=args.job, nworkers=args.workers, settings=job_settings(args),
                          base_port=args.base_port, seed=args.seed,
                          session=args.session or 0, precision=precision,
                          impairment=Impairment(loss=args.loss, duplicate=args.duplicate,
                                                reorder=args.reorder))
        switch = f"{args.switch[0]}:{args.switch[1]}" if args.switch else None
        with LocalCluster(spec, switch=switch) as cluster:
            res = cluster.allreduce_check(n, args.iterations)
    except (OSError, ValueError, RuntimeError, TimeoutError) as e:
        raise CliError(str(e)) from None
    gbps = 8 * 4 * n * args.iterations / res["seconds"] / 1e9
    print(f"{args.workers} workers x {n} float32, {args.iterations} iterations, {args.mode}, "
          f"{precision}: "
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
