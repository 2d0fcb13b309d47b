"""Serve the reference switch model over UDP: the software switch.

Jobs come from a TOML file (one [[job]] table each) or from flags:

    ina switch --config jobs.toml
    ina switch --job 1 --workers 127.0.0.1:20000,127.0.0.1:20001 --mode bounded --deadline-ms 5
    ina switch --job 1 --local-workers 4 --base-port 20000      (4 workers on this host)
    ina switch --status [--address 127.0.0.1:19900]              (counters of a running switch, JSON)

jobs.toml:
    [[job]]
    id = 1
    workers = ["10.0.0.1:20000", "10.0.0.2:20000"]   # worker w is workers[w]
    window = 64
    elements = 256          # per packet; 64 or 256 on Ethernet, more on loopback
    deadline_ms = 5.0       # bounded mode
    mode = "reliable"       # or "bounded"
    # multicast = "239.1.1.1:20000"   # one copy to an IP multicast group
"""

import json
import sys

from ina_fabric.protocol.fields import INA_UDP_PORT

HELP = "run the software switch (reference model over UDP), or query a running one"


def add_arguments(p):
    p.add_argument("--config", metavar="TOML", help="job table file")
    p.add_argument("--listen", default=f"0.0.0.0:{INA_UDP_PORT}", metavar="IP:PORT",
                   help=f"address to serve on (default 0.0.0.0:{INA_UDP_PORT})")
    p.add_argument("--job", type=int, default=1, help="job id for a job given by flags")
    p.add_argument("--workers", metavar="LIST", help="comma-separated worker ip:port list")
    p.add_argument("--local-workers", type=int, metavar="N",
                   help="N workers on 127.0.0.1, ports base-port .. base-port+N-1")
    p.add_argument("--base-port", type=int, default=20000)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--elements", type=int, default=1024)
    p.add_argument("--mode", choices=("reliable", "bounded"), default="reliable")
    p.add_argument("--deadline-ms", type=float, default=5.0)
    p.add_argument("--status", action="store_true",
                   help="print the counters of a running switch as JSON and exit")
    p.add_argument("--address", default=f"127.0.0.1:{INA_UDP_PORT}",
                   help="switch to query with --status")


def _addr(text):
    from ..cli import CliError
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise CliError(f"bad address {text!r}: expected ip:port")
    return host, int(port)


def jobs_from_args(args):
    from ..cli import CliError
    from ina_fabric.protocol.jobtable import JobConfig, ConfigError, load_jobs_toml
    try:
        if args.config:
            return load_jobs_toml(args.config)
        if args.local_workers:
            members = [f"127.0.0.1:{args.base_port + w}" for w in range(args.local_workers)]
        elif args.workers:
            members = [m.strip() for m in args.workers.split(",") if m.strip()]
        else:
            raise CliError("no jobs: give --config FILE, --workers LIST or --local-workers N")
        return [JobConfig(args.job, tuple(members), args.window, args.elements,
                          args.deadline_ms / 1e3, args.mode)]
    except ConfigError as e:
        raise CliError(str(e)) from None


def run(args):
    from ..cli import CliError
    from ..switch import SwitchServer, query_status
    if args.status:
        try:
            print(json.dumps(query_status(_addr(args.address)), indent=2, sort_keys=True))
        except OSError as e:
            raise CliError(f"no answer from switch at {args.address}: {e}") from None
        return 0
    jobs = jobs_from_args(args)
    try:
        server = SwitchServer(jobs, *_addr(args.listen),
                              log=lambda m: print(m, file=sys.stderr))
    except OSError as e:
        raise CliError(f"cannot listen on {args.listen}: {e}") from None
    host, port = server.address
    for j in jobs:
        print(f"job {j.job}: {j.n} workers, window {j.window}, {j.elements} elements/packet, "
              f"{j.mode}" + (f", deadline {j.deadline * 1e3:g} ms" if j.mode == "bounded" else ""),
              file=sys.stderr)
    print(f"ina switch listening on {host}:{port} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        server.close()
        c = {k: v for k, v in server.model.counters.items() if v}
        print(f"ina switch stopped; counters: {json.dumps(c, sort_keys=True)}", file=sys.stderr)
    return 0
