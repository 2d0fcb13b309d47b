"""Joint vs decoupled control of precision and accumulation: time to target, side by side.

    ina bench control                          simulation at paper scale + knob trace PNGs
    ina bench control --real                   also real training (digits, 4 workers, throttled)
    ina bench control --plot 'X_{link}.png' where the knob trace PNGs go

Figures are ratios of time to target (other controller / Joint) measured in one run.
"""

import argparse
import pathlib
import sys


def main(argv=None) -> int:
    from ina_fabric.bench import _results
    from ina_fabric.host.control.experiments import (real_comparison, real_trace, sim_comparison,
                                          trace_figure)
    ap = argparse.ArgumentParser(prog="ina bench control", description=__doc__.strip().splitlines()[0])
    ap.add_argument("--real", action="store_true", help="also run the real-training comparison")
    ap.add_argument("--real-levels", default="light,heavy")
    ap.add_argument("--plot", default=str(_results.RESULTS / "control_trace_{link}.png"),
                    help="knob trace PNG; {link} becomes 10G and 100G")
    ap.add_argument("--real-plot", default=str(_results.RESULTS / "control_real.png"))
    ap.add_argument("--real-trace", default=str(_results.RESULTS / "control_real_trace.png"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    _results.RESULTS.mkdir(parents=True, exist_ok=True)
    figures = sim_comparison(seed=args.seed)
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
