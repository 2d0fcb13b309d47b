"""Serve the reference switch model over UDP: the software switch.

It starts with no job: jobs arrive by CONTROL datagrams (what `ina train`, the DDP hook
under torchrun and the local clusters send), sealed with the switch's control key
(HMAC-SHA256; see --key-file): nobody without the key installs a job or reads the
counters. Jobs can also be loaded at start from a TOML file (one [[job]] table each) or
from flags:

    ina switch                                                   (no job yet)
    ina switch --config jobs.toml
    ina switch --job 1 --workers 127.0.0.1:20000,127.0.0.1:20001 --mode bounded --deadline-ms 5
    ina switch --job 1 --local-workers 4 --base-port 20000      (4 workers on this host)
        [--session 0x5eed]   (the run's session id, which the workers must carry; default:
                              a fresh one, printed)
    ina switch --status [--switch 127.0.0.1:19900]               (counters of a running switch, JSON)
    ina switch --engine rtl                    (the gateware in Verilator, the model as scoreboard)
    ina switch --engine board --listen 198.18.41.2:19900 --tap-address 198.18.41.1/24
                                               (the whole board's datapath in Verilator on a TAP)

A tree of switches (docs/fabric.md): every switch runs `ina switch`; a leaf names its
parent, and one command installs a job on all of them, each entry sealed with that
switch's own key:

    ina switch --listen 198.18.1.1:19900 --parent 198.18.0.1:19900      (a leaf)
    ina switch --install-tree tree.toml --job 38 --mode bounded --deadline-ms 5
        (prints, per worker, its switch, its id there and the job's worker count)
    ina switch --status --tree tree.toml --job 38     (who the job waits for, per level)

A shared slot pool (docs/pool.md): the jobs share N slots; what does not fit is summed by
the parent, which holds the same jobs:

    ina switch --listen 127.0.0.1:19901                                  (the parent)
    ina switch --listen 127.0.0.1:19900 --pool-slots 256 --parent 127.0.0.1:19901

tree.toml:
    spine = "198.18.0.1:19900"
    spine_key_file = "spine.key"           # optional: else --key-file / the default key
    [[leaf]]
    switch = "198.18.1.1:19900"
    workers = ["198.18.1.10:20000", "198.18.1.11:20000"]
    key_file = "rack0.key"                 # optional

jobs.toml:
    [[job]]
    id = 1
    workers = ["10.0.0.1:20000", "10.0.0.2:20000"]   # worker w is workers[w]
    window = 64
    elements = 256          # per packet; 64 or 256 on Ethernet, more on loopback
    deadline_ms = 5.0       # bounded mode
    mode = "reliable"       # or "bounded"
    session = "0x5eed..."   # the run's session id (default: a fresh one per start)
    # multicast = "239.1.1.1:20000"   # one copy to an IP multicast group
"""

import json
import sys

from ina_fabric.protocol.fields import INA_UDP_PORT

HELP = "run the software switch (reference model over UDP), or query a running one"


def add_arguments(p):
    from ._common import (add_base_port_argument, add_job_arguments, parse_address,
                          add_session_argument)
    p.add_argument("--listen", default=f"0.0.0.0:{INA_UDP_PORT}", metavar="IP:PORT",
                   type=parse_address, help="address to serve on")
    p.add_argument("--config", metavar="TOML", help="job table file loaded at start")
    p.add_argument("--engine", choices=("auto", "fast", "model", "rtl", "board"),
                   default="auto",
                   help="fast: the compiled DATA path (recvmmsg batches); model: the "
                        "Python reference model, one datagram at a time; rtl: the "
                        "gateware (hw/ina) simulated by Verilator, with the model beside "
                        "it as a live scoreboard that stops the switch at the first "
                        "disagreement (core: $INA_RTL_PARAMS, JSON, over "
                        "host/switch/rtl.py RTL_PARAMS); board: the Versa board's whole datapath "
                        "(MAC, ARP/IPv4/UDP/ICMP, in-band control with the key, core, "
                        "replicator) in Verilator, its port 0 bridged to a TAP device: "
                        "--listen is the board's own IP, clients reach it through the "
                        "kernel (options below); auto: fast where it is built")
    p.add_argument("--pace-rate", metavar="RATE", default="0",
                   help="RESULTs to any one worker no faster than RATE (its downlink: "
                        "e.g. 100mbit, or bit/s), so a deadline that closes many slots at "
                        "once does not overflow a downlink queue; fast engine only; "
                        "default 0: off")
    p.add_argument("--gso", action="store_true",
                   help="send a run of RESULTs to one destination as one UDP GSO send "
                        "(fast engine; docs/congestion.md, \"Sending in runs\"); default: "
                        "every RESULT on its own")
    p.add_argument("--key-file", metavar="FILE",
                   help="control key (CONTROL and STATUS are taken only when sealed with "
                        "it); default: $INA_SWITCH_KEY, else $INA_SWITCH_KEY_FILE, else "
                        "~/.config/ina-fabric/switch.key, created (0600) when missing")
    b = p.add_argument_group("the board engine (--engine board; root)")
    b.add_argument("--tap", default="inaboard0", metavar="NAME",
                   help="name of the TAP device the board's port 0 is bridged to")
    b.add_argument("--tap-address", metavar="CIDR",
                   help="the kernel side's address on the TAP (e.g. 198.18.41.1/24), so "
                        "this namespace reaches the board through it; the board's worker "
                        "subnet is its network")
    b.add_argument("--netns", metavar="NAME", help="make the TAP in this network namespace")
    b.add_argument("--bridge", metavar="NAME",
                   help="attach the TAP to this bridge, and take the board's address off "
                        "it (the lab's switch namespace)")
    b.add_argument("--idle-tail-us", type=float, default=250.0, metavar="US",
                   help="simulated microseconds the board's clock keeps running after "
                        "the last frame (the control plane's replies, deadlines); then it "
                        "stops until the next frame (default 250)")
    g = p.add_argument_group("a job given by flags (instead of --config; without either "
                             "the switch starts with no job and jobs arrive by CONTROL)")
    g.add_argument("--job", type=int, default=1, help="job id")
    g.add_argument("--workers", metavar="LIST", help="comma-separated worker ip:port list")
    g.add_argument("--local-workers", type=int, metavar="N",
                   help="N workers on 127.0.0.1, ports base-port .. base-port+N-1")
    add_base_port_argument(p)
    add_session_argument(g, "the job's session id, which every DATA of its workers must "
                            "carry (default: a fresh one, printed at start)")
    add_job_arguments(p, "ethernet")
    p.add_argument("--metrics", metavar="[IP:]PORT",
                   help="also serve every counter, and each job's figures, in the "
                        "Prometheus text format on http://IP:PORT/metrics (default IP "
                        "127.0.0.1; read from STATUS; needs prometheus_client)")
    t = p.add_argument_group("trees of switches (docs/fabric.md)")
    t.add_argument("--parent", type=parse_address, metavar="IP:PORT",
                   help="this switch's parent: the job given by flags sends its sums "
                        "there, and a tree entry that names another parent is refused")
    t.add_argument("--pool-slots", type=int, metavar="N",
                   help="share N slots of memory among all jobs (docs/pool.md): no job is "
                        "refused for memory, and a slot that finds the pool full is summed "
                        "by --parent (needed; it holds the same jobs) instead; a job given "
                        "by flags then stays a flat job (not a tree leaf). Fast and model "
                        "engines. Default: each job has its own 2 x window slots")
    t.add_argument("--index", type=int, default=0,
                   help="with --parent: this switch's member id in the parent's entry")
    t.add_argument("--total-workers", type=int, metavar="N",
                   help="the job given by flags has child switches as members (--workers "
                        "lists their addresses), covering N workers in all")
    t.add_argument("--install-tree", metavar="TOML",
                   help="install job --job on every switch of the tree in TOML (leaves, "
                        "then the spine; all or nothing) and exit")
    t.add_argument("--spine-deadline-ms", type=float,
                   help="with --install-tree: the spine's deadline (default: twice "
                        "--deadline-ms; it must be longer)")
    t.add_argument("--tree", metavar="TOML",
                   help="with --status: the job --job on every switch of this tree, who "
                        "it waits for per level")
    q = p.add_argument_group("querying a running switch")
    q.add_argument("--status", action="store_true",
                   help="print the counters of a running switch as JSON and exit")
    q.add_argument("--switch", "--address", dest="switch", type=parse_address,
                   default=f"127.0.0.1:{INA_UDP_PORT}", metavar="IP:PORT",
                   help="the switch --status asks")


def jobs_from_args(args):
    """The jobs to load at start: from --config, --workers or --local-workers; none
    otherwise (jobs then arrive by CONTROL, as the torchrun path installs them)."""
    from ..cli import CliError
    from ._common import job_settings
    from ina_fabric.protocol.jobtable import JobConfig, ConfigError, load_jobs_toml
    try:
        if args.config:
            return load_jobs_toml(args.config)
        if args.local_workers:
            if not args.base_port:
                raise CliError("--local-workers needs --base-port (the workers' first port)")
            members = [f"127.0.0.1:{args.base_port + w}" for w in range(args.local_workers)]
        elif args.workers:
            members = [m.strip() for m in args.workers.split(",") if m.strip()]
        else:
            return []
        cfg = JobConfig.from_settings(args.job, members, job_settings(args),
                                      session=args.session)
        if (args.parent and args.pool_slots is None) or args.total_workers or args.index:
            import dataclasses
            cfg = dataclasses.replace(cfg, parent=args.parent, index=args.index,
                                      children=bool(args.total_workers),
                                      workers=args.total_workers or 0)
        return [cfg]
    except ConfigError as e:
        raise CliError(str(e)) from None


def run(args):
    from ..cli import CliError
    from ..switch import SwitchServer, query_status, fast
    from ina_fabric.protocol.jobtable import ConfigError
    import os
    from ..switch.keys import switch_key, KeyMissing, default_key_path
    try:
        key = switch_key(create=not args.status, path=args.key_file)
    except (KeyMissing, OSError) as e:
        raise CliError(str(e)) from None
    if args.install_tree or args.tree:
        return _tree_command(args, key)
    if args.status:
        try:
            print(json.dumps(query_status(args.switch, key=key), indent=2, sort_keys=True))
        except OSError as e:
            raise CliError(f"no answer from switch at {args.switch[0]}:{args.switch[1]} (is it "
                           f"up, and does it have this control key?): "
                           f"{e}") from None
        return 0
    if args.pool_slots is not None:
        if args.pool_slots < 0:
            raise CliError(f"--pool-slots {args.pool_slots}: must be >= 0")
        if not args.parent:
            raise CliError("--pool-slots needs --parent IP:PORT (the switch that sums what "
                           "the pool cannot hold)")
        if args.engine in ("rtl", "board"):
            raise CliError(f"--pool-slots: the {args.engine} engine has no slot pool yet "
                           f"(docs/pool.md); use --engine fast or model")
    jobs = jobs_from_args(args)
    if args.engine == "board":
        return run_board(args, jobs, key)
    from ..lab.topology import parse_rate, TopologyError
    try:
        pace = parse_rate(args.pace_rate) if args.pace_rate not in ("0", "") else 0.0
    except TopologyError as e:
        raise CliError(f"--pace-rate {args.pace_rate!r}: {e}") from None
    try:
        server = SwitchServer(jobs, *args.listen, key=key, engine=args.engine,
                              log=lambda m: print(m, file=sys.stderr), pace_rate=pace,
                              parent=args.parent, pool_slots=args.pool_slots,
                              gso=args.gso)
    except fast.EngineUnavailable as e:
        raise CliError(str(e)) from None
    except ConfigError as e:       # a job that does not fit the core
        raise CliError(str(e)) from None
    except (RuntimeError, ValueError) as e:   # the RTL engine: no Verilator, a bad
        if pace and "pace_rate" in str(e):   # INA_RTL_PARAMS, a failed build
            raise CliError(f"--pace-rate: {e}") from None
        if args.engine != "rtl":
            raise
        raise CliError(f"--engine rtl: {e}") from None
    except OSError as e:
        raise CliError(f"cannot listen on {args.listen[0]}:{args.listen[1]}: {e}") from None
    host, port = server.address
    metrics = _start_metrics(args.metrics, (host, port), key) if args.metrics else None
    if not jobs:
        print("no jobs yet: they arrive by CONTROL (ina train, the DDP hook, "
              "ina allreduce --switch)", file=sys.stderr)
    for j in jobs:
        print(f"job {j.job}: {j.n} workers, window {j.window}, {j.elements} elements/packet, "
              f"{j.mode}" + (f", deadline {j.deadline * 1e3:g} ms" if j.mode != "reliable" else "")
              + f", session 0x{j.session:016x}",
              file=sys.stderr)
    print(f"ina switch listening on {host}:{port} ({server.engine} engine; Ctrl-C to "
          f"stop); control key: "
          f"{'$INA_SWITCH_KEY' if os.environ.get('INA_SWITCH_KEY') and not args.key_file else args.key_file or default_key_path()}",
          file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        if metrics is not None:
            metrics.shutdown()
        server.close()
        c = {k: v for k, v in server.model.counters.items() if v}
        print(f"ina switch stopped; counters: {json.dumps(c, sort_keys=True)}", file=sys.stderr)
        if server.engine == "rtl":
            rtl = {k: v for k, v in server.model.rtl_stats().items() if k != "counters"}
            print(f"rtl: {json.dumps(rtl, sort_keys=True)}", file=sys.stderr)
    if server.failure:
        print(f"ina switch: {server.failure}", file=sys.stderr)
        return 1
    return 0


def _start_metrics(text, listen, key):
    """``--metrics [IP:]PORT``: the Prometheus endpoint, reading this switch's STATUS."""
    from ..cli import CliError
    bind, _, port = str(text).rpartition(":")
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise CliError(f"--metrics {text!r}: expected PORT or IP:PORT")
    try:
        from ..switch.metrics import serve_metrics
        target = ("127.0.0.1" if listen[0] in ("0.0.0.0", "") else listen[0], listen[1])
        httpd, bound = serve_metrics(target, int(port), bind or "127.0.0.1", key)
    except ImportError:
        raise CliError("--metrics needs prometheus_client: pip install "
                       "'ina-fabric[watch]'") from None
    except OSError as e:
        raise CliError(f"--metrics: cannot listen on {bind or '127.0.0.1'}:{port}: {e}") \
            from None
    print(f"metrics: http://{bind or '127.0.0.1'}:{bound}/metrics", file=sys.stderr,
          flush=True)
    return httpd


def run_board(args, jobs, key):
    """``--engine board``: the board on a TAP until SIGINT/SIGTERM; its figures at exit."""
    from ..cli import CliError
    from ..switch.board import BoardSwitch
    if jobs:
        raise CliError("--engine board takes its jobs by CONTROL only (sealed with the key "
                       "it is built with), not --config/--workers/--local-workers")
    if args.pace_rate not in ("0", ""):
        raise CliError("--pace-rate is the fast engine's; the board sends at line rate")
    try:
        server = BoardSwitch(*args.listen, key=key, tap=args.tap,
                             tap_address=args.tap_address, netns=args.netns,
                             bridge=args.bridge, idle_tail_us=args.idle_tail_us,
                             log=lambda m: print(m, file=sys.stderr))
    except (RuntimeError, ValueError) as e:
        raise CliError(f"--engine board: {e}") from None
    except OSError as e:
        raise CliError(f"--engine board: cannot make TAP {args.tap}: {e}") from None
    host, port = server.address
    print(f"ina switch (board) at {host}:{port} on TAP {args.tap}"
          f"{' in ' + args.netns if args.netns else ''}"
          f"{' (bridge ' + args.bridge + ')' if args.bridge else ''}"
          f"{', kernel side ' + args.tap_address if args.tap_address else ''}; "
          f"Ctrl-C to stop", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        st = server.stats()
        server.close()
        print(f"ina switch (board) stopped: {json.dumps(st, sort_keys=True)}",
              file=sys.stderr)
    return 0


def _tree_command(args, key):
    """--install-tree TOML, or --status --tree TOML."""
    from ..cli import CliError
    from ._common import job_settings
    from ..switch.tree import load_tree_toml, install_tree, tree_status, worker_roles
    from ina_fabric.protocol.control_client import JobRefused
    from ina_fabric.protocol.jobtable import ConfigError
    from ina_fabric.protocol.keys import KeyMissing
    if args.tree and not args.status:
        raise CliError("--tree goes with --status (or use --install-tree TOML)")
    try:
        tree = load_tree_toml(args.install_tree or args.tree)
        if args.tree:
            print(json.dumps(tree_status(tree, args.job, key_file=args.key_file), indent=2,
                             sort_keys=True))
            return 0
        sd = None if args.spine_deadline_ms is None else args.spine_deadline_ms / 1e3
        jobs = install_tree(tree, args.job, job_settings(args), session=args.session,
                            spine_deadline=sd, key_file=args.key_file)
    except (ConfigError, JobRefused, KeyMissing, OSError) as e:
        raise CliError(str(e)) from None
    session = next(iter(jobs.values())).session
    print(json.dumps({"job": args.job, "session": f"0x{session:016x}",
                      "workers": worker_roles(tree)}, indent=2))
    return 0
