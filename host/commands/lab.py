"""Emulated clusters in network namespaces (needs root): every host its own namespace,
links shaped by tbf (and delayed by the userspace delay line), `ina switch` in the
network. Labs are named by an id, so two can coexist; `down` cleans up after a crash.

    ina lab up rack                              4 hosts, 1 Gbit links, lab id 0
    ina lab up rack --hosts 8 --rate 100mbit --switch --id 1
    ina lab up rack --set delay_ms=5 --set loss=0.001
    ina lab up wan9 --switch --set delay_scale=0.1   the optimizer's 9 islands
    ina lab up fabric --racks 4 --hosts-per-rack 4 --rate 100mbit --switch
                                                 racks under a spine, 4:1 uplinks; the
                                                 switches as a tree (ToRs under the spine)
    ina lab up fabric --racks 2 --hosts-per-rack 2 --switch rtl
                                                 the same through the gateware in Verilator
                                                 (the ToRs' cores leaves, the spine's a spine)
    ina lab up my_topology.toml
    ina lab run h0 -- python -c 'print(1)'       in host h0's namespace (INA_SWITCH set)
    ina lab status [--seconds 1] [--json]        links: rate, drops, backlog; RTT P50/P99
    ina lab traffic --from h2 --to h0 --kind udp --rate 80mbit --on-ms 50 --off-ms 50 --seconds 30
    ina lab down [--id 1 | --all]
    ina lab list

Rates are bits per second, decimal as in tc (100mbit = 10^8 bit/s). Addresses come from
198.18.0.0/15; nothing is routed out of a lab's namespaces.
"""

HELP = "emulated clusters in network namespaces: up, run, status, down (root)"


def add_arguments(p):
    from ._common import HelpFormatter
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def with_id(q):
        q.add_argument("--id", default="0", help="lab id (1..8 lowercase letters/digits)")
        return q

    up = with_id(sub.add_parser("up", help="build a lab from a topology",
                                formatter_class=HelpFormatter))
    up.add_argument("topology", help="a built-in (rack) or a TOML file")
    up.add_argument("--hosts", type=int, help="shorthand for --set hosts=N")
    up.add_argument("--rate", help="shorthand for --set rate=R (e.g. 100mbit, 1gbit)")
    up.add_argument("--racks", type=int, help="fabric: shorthand for --set racks=R")
    up.add_argument("--hosts-per-rack", type=int,
                    help="fabric: shorthand for --set hosts_per_rack=H")
    up.add_argument("--oversubscription", type=float,
                    help="fabric: rack hosts' rate / uplink rate (default 4)")
    up.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="set a topology parameter (repeatable)")
    up.add_argument("--switch", nargs="?", const="auto", default=None, metavar="ENGINE",
                    choices=("auto", "fast", "model", "rtl", "board"),
                    help="also start `ina switch` in every switch namespace, on the bridge "
                         "(fabric: the spine, then each top-of-rack switch with the spine "
                         "as its parent); ENGINE as `ina switch --engine` (rtl on a "
                         "fabric: the spine's core with the tree option, each top-of-rack "
                         "switch's with the tree and leaf options; board: the "
                         "simulated board on a TAP in the bridge, taking the bridge's "
                         "address; frames up to 1,518 bytes, so keep mtu=1500; not with "
                         "a fabric's tree)")
    run = with_id(sub.add_parser("run", help="run a command in a node's namespace",
                                 formatter_class=HelpFormatter))
    run.add_argument("node", help="a host (h0, ...) or the switch (sw)")
    run.add_argument("argv", nargs="+", metavar="-- CMD", help="the command and its arguments")
    st = with_id(sub.add_parser("status", help="links, queues, RTT of a lab",
                                formatter_class=HelpFormatter))
    st.add_argument("--seconds", type=float, default=1.0,
                    help="sample link counters over this long")
    st.add_argument("--probes", type=int, default=20,
                    help="RTT probes per host to the switch (0: none)")
    st.add_argument("--json", action="store_true", help="print JSON")
    tr = with_id(sub.add_parser("traffic", help="start bounded background flows (on/off)",
                                formatter_class=HelpFormatter))
    tr.add_argument("--kind", choices=("tcp", "udp"), default="tcp",
                    help="tcp: bulk flow while on; udp: paced at --rate while on")
    tr.add_argument("--from", dest="src", required=True, help="source node")
    tr.add_argument("--to", dest="dst", required=True, help="sink node")
    tr.add_argument("--seconds", type=float, default=30.0, help="stops by itself after this")
    tr.add_argument("--on-ms", type=float, default=100.0, help="on-period")
    tr.add_argument("--off-ms", type=float, default=0.0, help="off-period (0: always on)")
    tr.add_argument("--rate", default="10mbit", help="udp: sending rate while on")
    tr.add_argument("--flows", type=int, default=1, help="how many such flows")
    dn = with_id(sub.add_parser("down", help="remove a lab (also after a crash)",
                                formatter_class=HelpFormatter))
    dn.add_argument("--all", action="store_true", help="remove every lab")
    sub.add_parser("list", help="the labs that exist", formatter_class=HelpFormatter)


def _topology(args):
    from ..cli import CliError
    from ..lab import TopologyError, load
    sets = {}
    for kv in args.set:
        k, sep, v = kv.partition("=")
        if not sep:
            raise CliError(f"--set {kv!r}: expected NAME=VALUE")
        sets[k.strip()] = v.strip()
    if args.hosts is not None:
        sets["hosts"] = args.hosts
    if args.rate is not None:
        sets["rate"] = args.rate
    for flag, key in (("racks", "racks"), ("hosts_per_rack", "hosts_per_rack"),
                      ("oversubscription", "oversubscription")):
        if getattr(args, flag, None) is not None:
            sets[key] = getattr(args, flag)
    try:
        return load(args.topology, sets)
    except TopologyError as e:
        raise CliError(str(e)) from None


def _up(args):
    from ..cli import CliError
    from ..lab import Lab, format_rate
    topo = _topology(args)
    if args.switch == "board" and topo.spine:
        raise CliError("--switch board: a fabric's switches run fast, model or rtl (the "
                       "simulated board takes one bridge's address, not a tree)")
    lab = Lab(topo, args.id).up()
    switches = []
    if args.switch and topo.spine:
        switches = lab.start_fabric(tree=True, engine=args.switch)
    elif args.switch:
        switches = [lab.start_switch(s.name, engine=args.switch)
                    for s in topo.switches]
    print(f"lab {lab.id} up: {topo.name}, {len(topo.hosts)} hosts, "
          f"{len(topo.switches)} switches, {len(topo.wan)} routed links")
    for h in topo.hosts:
        extra = "".join(f", {k} {v:g}" for k, v in (("delay_ms", h.link.delay_ms),
                                                    ("jitter_ms", h.link.jitter_ms),
                                                    ("loss", h.link.loss)) if v)
        print(f"  {h.name:4s} {str(h.address):15s} {format_rate(h.link.rate)} to "
              f"{h.switch}{extra}")
    for s in topo.switches:
        label = f" ({topo.labels[s.name]})" if s.name in topo.labels else ""
        print(f"  {s.name:4s} {str(s.address):15s} bridge br0, {s.subnet}{label}")
    if topo.spine:
        print(f"  uplinks: {format_rate(topo.wan[0].link.rate)} each, oversubscription "
              f"{topo.oversubscription:g}:1")
    for w in topo.wan:
        print(f"  {w.a}-{w.b:4s} {str(w.subnet):15s} {format_rate(w.link.rate)}, "
              f"{w.link.delay_ms:.2f} ms one way"
              + (f", jitter {w.link.jitter_ms:g} ms" if w.link.jitter_ms else "")
              + (f", loss {w.link.loss:g}" if w.link.loss else ""))
    for host, port in switches:
        print(f"  ina switch on {host}:{port}")
    return 0


def _run(args):
    import subprocess
    from ..lab import Lab
    lab = Lab.attach(args.id)
    argv = args.argv[1:] if args.argv and args.argv[0] == "--" else args.argv
    p = lab.popen(args.node, argv, start_new_session=False)
    try:
        return p.wait()
    except KeyboardInterrupt:
        p.terminate()
        try:
            return p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            return 130


def _status(args):
    import json
    from ..lab import Lab, format_rate
    from ..lab.status import status
    lab = Lab.attach(args.id)
    doc = status(lab, seconds=args.seconds, probes=args.probes)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"lab {lab.id}: {lab.topo.name}, {len(lab.hosts)} hosts; "
          f"counters over {doc['seconds']:.1f} s")
    print(f"{'link':14s} {'rate':>8s} {'up Mb/s':>8s} {'down Mb/s':>9s} {'drops up':>8s} "
          f"{'drops dn':>8s} {'backlog':>8s} {'rtt p50':>8s} {'rtt p99':>8s}")
    for row in doc["links"]:
        r = row.get("rtt_ms") or {}
        print(f"{row['host'] + '-' + row['switch']:14s} {format_rate(row['rate']):>8s} "
              f"{row['up_mbit_s']:8.1f} {row['down_mbit_s']:9.1f} {row['up']['drops']:8d} "
              f"{row['down']['drops']:8d} {row['up']['backlog'] + row['down']['backlog']:8d} "
              f"{r.get('p50', float('nan')):8.3f} {r.get('p99', float('nan')):8.3f}")
    for row in doc.get("wan", []):
        print(f"{row['a'] + '-' + row['b']:14s} {format_rate(row['rate']):>8s} "
              f"{row['ab_mbit_s']:8.1f} {row['ba_mbit_s']:9.1f} {row['ab']['drops']:8d} "
              f"{row['ba']['drops']:8d} {row['ab']['backlog'] + row['ba']['backlog']:8d}"
              f"   delay {row['delay_ms']:.2f} ms")
    for name, s in doc["services"].items():
        print(f"service {name}: pid {s['pid']} in {s['node']}, "
              f"{'running' if s['alive'] else 'exited'}")
    return 0


def _traffic(args):
    from ..lab import Lab
    from ..lab.traffic import Flow, start
    lab = Lab.attach(args.id)
    lab.ns(args.src), lab.ns(args.dst)           # both exist
    flow = Flow(args.kind, args.src, args.dst, args.seconds, args.on_ms, args.off_ms,
                args.rate)
    names = start(lab, [flow] * args.flows)
    duty = args.on_ms / (args.on_ms + args.off_ms)
    print(f"lab {lab.id}: {args.flows} {args.kind} flow(s) {args.src} -> {args.dst} for "
          f"{args.seconds:g} s, duty cycle {duty:.0%}"
          + (f", {args.rate} while on" if args.kind == "udp" else "")
          + f"; services {', '.join(names)}")
    return 0


def _down(args):
    from ..lab import down, down_all
    done = down_all() if args.all else [down(args.id)]
    for d in done:
        print(f"lab {d['lab']} down: {d['namespaces']} namespaces, "
              f"{d['processes']} processes removed")
    if not done:
        print("no labs")
    return 0


def _list(args):
    from ..lab import list_labs, load_state
    for i in list_labs():
        st = load_state(i) or {}
        t = st.get("topology", {})
        what = st.get("status") or f"left over (no state): ina lab down --id {i}"
        hosts = f"{len(t['hosts'])} hosts" if t.get("hosts") else ""
        print(f"{i:8s} {what} {t.get('name', '')} {hosts}")
    return 0


def run(args):
    from ..cli import CliError
    from ..lab import LabError, TopologyError, available
    if args.action != "list":
        why = available()
        if why:
            raise CliError(f"ina lab {args.action}: {why}")
    try:
        return {"up": _up, "run": _run, "status": _status, "traffic": _traffic, "down": _down,
                "list": _list}[args.action](args)
    except (LabError, TopologyError, ValueError) as e:
        raise CliError(str(e)) from None
