"""Quantize+packetize throughput as a ratio to numpy.copyto of the same bytes, and
loopback allreduce through the software switch."""

import time

import numpy as np

from ina_fabric.bench._results import write
from ina_fabric.host.transport import quantize as Q
from ina_fabric.protocol import HEADER_BYTES


def best_of(fn, reps=7):
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def packetize_ratio(n=1 << 22, elements=1024, workers=4):
    x = (np.random.default_rng(0).standard_normal(n)).astype(np.float32)
    k = n // elements
    stride = HEADER_BYTES + 4 * elements
    buf = np.zeros(k * stride, np.uint8)
    exps = Q.local_exponents(x, elements)
    S = Q.scale_bits(workers)
    dst = np.empty_like(x)

    def fused():
        Q._pack_many(x, elements, exps, S, buf, stride)

    def three_pass():  # the plain-numpy way: scale, round/cast, byteswap into packets
        scaled = x.reshape(k, elements) * np.exp2(S - exps.astype(np.float64))[:, None]
        q = np.rint(scaled).astype(">i4")
        buf.reshape(k, stride)[:, HEADER_BYTES:] = q.view(np.uint8).reshape(k, -1)

    fused()  # compile
    t_copy = best_of(lambda: np.copyto(dst, x))
    t_fused = best_of(fused)
    t_numpy = best_of(three_pass)
    t_exp = best_of(lambda: Q.local_exponents(x, elements))
    return {"bytes": 4 * n, "copyto_GBps": 4 * n / t_copy / 1e9,
            "ratio_fused_to_copyto": t_copy / t_fused,
            "ratio_numpy_3pass_to_copyto": t_copy / t_numpy,
            "ratio_exponents_to_copyto": t_copy / t_exp,
            "ratio_scan_plus_pack_to_copyto": t_copy / (t_exp + t_fused)}


def loopback_allreduce(size, workers, elements):
    from ina_fabric.host.cluster import LocalCluster, WorkerSpec
    from ina_fabric.protocol.jobtable import job_defaults
    spec = WorkerSpec(nworkers=workers, settings=job_defaults("loopback", elements=elements))
    with LocalCluster(spec) as c:
        c.allreduce_check(size, 1)  # warm-up (numba caches, socket buffers)
        res = c.allreduce_check(size, 2)
    t = res["seconds"] / 2
    return {"size": size, "workers": workers, "elements_per_packet": elements,
            "ms_per_allreduce": t * 1e3, "Gbps_per_worker": 32 * size / t / 1e9,
            "retransmits": res["stats"]["retransmits"],
            "within_bound": res["within_bound"]}


def main(argv=()):
    import argparse
    ap = argparse.ArgumentParser(prog="ina bench packetize", description=__doc__.strip())
    ap.add_argument("--workers", type=int, default=4, help="workers in the loopback run")
    args = ap.parse_args(list(argv))
    figs = {"packetize": packetize_ratio(workers=args.workers)}
    p = figs["packetize"]
    print(f"quantize+packetize (fused, numba) / numpy.copyto: {p['ratio_fused_to_copyto']:.2f}"
          f"   (plain numpy 3-pass: {p['ratio_numpy_3pass_to_copyto']:.2f}; "
          f"target >= 0.5)")
    print(f"  exponent scan alone: {p['ratio_exponents_to_copyto']:.2f}; scan + pack, both "
          f"passes: {p['ratio_scan_plus_pack_to_copyto']:.2f} (the scan must run before the "
          f"exponents are agreed, so it cannot be fused into the pack)")
    figs["loopback"] = []
    for elements in (1024, 8192):
        r = loopback_allreduce(1 << 22, args.workers, elements)
        figs["loopback"].append(r)
        print(f"loopback allreduce, {args.workers} workers x 4M float32, {elements} elements/packet: "
              f"{r['ms_per_allreduce']:.0f} ms, {r['Gbps_per_worker']:.2f} Gb/s per worker")
    write("packetize", figs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
