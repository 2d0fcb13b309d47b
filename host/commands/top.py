"""Watch a running switch live: its jobs, the rates of its counters, who each job waits
for, and its drops (a terminal view, redrawn every --interval seconds; Ctrl-C to stop).

Everything comes from the switch's STATUS (authenticated with the control key, as
`ina switch --status`), so it works for the software switch, the RTL engine and the
board alike.

    ina top                               the switch at 127.0.0.1:<INA port>
    ina top --switch 198.18.0.1:19900     another switch
    ina top --once                        two reads --interval apart, drawn once, then exit
"""

import sys

HELP = "watch a running switch: jobs, counter rates, waiting_for, drops (live)"


def add_arguments(p):
    from ina_fabric.protocol.fields import INA_UDP_PORT
    from ._common import parse_address
    p.add_argument("--switch", type=parse_address, default=("127.0.0.1", INA_UDP_PORT),
                   metavar="IP:PORT", help="the switch to watch")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between reads (rates are over this interval)")
    p.add_argument("--once", action="store_true",
                   help="draw once (after two reads) and exit")
    p.add_argument("--key-file", metavar="FILE", help="the control key's file "
                   "(default: INA_SWITCH_KEY, INA_SWITCH_KEY_FILE, or the machine's key)")


def render(before: dict, after: dict, addr):
    """The view (a ``rich`` renderable) of two STATUS snapshots."""
    from rich.console import Group
    from rich.table import Table
    from ..switch.metrics import rates
    r = rates(before, after)
    c = after["counters"]
    jobs = Table(title=f"switch {addr[0]}:{addr[1]}: {len(after['jobs'])} job(s)",
                 title_justify="left")
    for col in ("job", "mode", "workers", "window", "elements", "deadline ms",
                "open slots", "position", "waiting_for"):
        jobs.add_column(col, justify="left" if col in ("mode", "waiting_for") else "right")
    for job, st in sorted(after["jobs"].items(), key=lambda kv: int(kv[0])):
        wait = st.get("waiting_for", [])
        jobs.add_row(str(job), st.get("mode", ""), str(st.get("workers", "")),
                     str(st.get("window", "")), str(st.get("elements", "")),
                     f"{st.get('deadline_ms', 0):g}", str(st.get("open_slots", "")),
                     str(st.get("position", "")),
                     ("[red]" + ", ".join(map(str, wait)) + "[/]") if wait else "-")
    traffic = Table(title="rates (per second) and totals", title_justify="left")
    for col in ("counter", "/s", "total"):
        traffic.add_column(col, justify="left" if col == "counter" else "right")
    shown = [k for k in ("rx", "rx_data", "accepted", "results", "partials", "resent",
                         "duplicates", "late", "overflows", "skipped") if k in c]
    for k in shown:
        traffic.add_row(k, f"{r.get(k, 0.0):,.0f}", f"{c[k]:,}")
    drops = Table(title="drops and refusals", title_justify="left")
    for col in ("counter", "/s", "total"):
        drops.add_column(col, justify="left" if col == "counter" else "right")
    for k in sorted(k for k in c if k.startswith("drop_") or k in (
            "control_refused", "errors_sent", "errors_limited", "status_unpadded")):
        style = "[red]" if c[k] else ""
        drops.add_row(f"{style}{k}", f"{r.get(k, 0.0):,.0f}", f"{c[k]:,}")
    return Group(jobs, traffic, drops)


def run(args):
    from ..cli import CliError
    try:
        from rich.console import Console
        from rich.live import Live
    except ImportError:
        raise CliError("ina top needs rich: pip install 'ina-fabric[watch]'") from None
    import time
    from ..switch.keys import switch_key, KeyMissing
    from ..switch.metrics import snapshot
    if not args.interval > 0:
        raise CliError("--interval must be > 0 seconds")
    try:
        key = switch_key(create=False, path=args.key_file)
    except (KeyMissing, OSError) as e:
        raise CliError(str(e)) from None

    def read():
        try:
            return snapshot(args.switch, key=key)
        except (OSError, ValueError) as e:
            raise CliError(f"no answer from switch at {args.switch[0]}:{args.switch[1]} "
                           f"(is it up, and does it have this control key?): {e}") from None

    console = Console(file=sys.stdout)
    before = read()
    time.sleep(args.interval)
    after = read()
    if args.once:
        console.print(render(before, after, args.switch))
        return 0
    with Live(render(before, after, args.switch), console=console,
              refresh_per_second=4) as live:
        try:
            while True:
                time.sleep(args.interval)
                before, after = after, read()
                live.update(render(before, after, args.switch))
        except KeyboardInterrupt:
            pass
    return 0
