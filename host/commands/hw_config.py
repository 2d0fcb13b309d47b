"""Job-table bytes for the FPGA core.

    ina hw-config jobs.toml                      one hex line per job: JobConfig.to_bytes()
    ina hw-config jobs.toml --format control     CONTROL datagrams (INA header + entry +
                                                 nonce and tag under the control key), hex
    ina hw-config jobs.toml --format bin -o t.bin   entries, each after a 2-byte length
    ina hw-config jobs.toml --format regs        register writes "addr value" for the core's
                                                 register bus (ina_fabric/protocol/regs.py), job k -> entry k

The entry bytes are the ones the software switch loads (ina_fabric/protocol/jobtable.py). The
``regs`` form also checks that each job fits the core (window a power of two within the
core's window, elements and workers within the core's) and converts the deadline to
core clock cycles.

Each job carries its run's session id (the TOML's ``session``, else a fresh one per
invocation, printed to stderr): the workers must be given the same one (``ina train
--static-job --session ID``, INA_SESSION), or the core drops their DATA as
``drop_bad_session``.
"""

HELP = "emit the job-table bytes (or register writes) that configure the FPGA core"

FORMATS = ("hex", "bin", "control", "regs")


def add_arguments(p):
    p.add_argument("config", help="jobs TOML file ([[job]] tables, as for `ina switch`)")
    p.add_argument("--format", choices=FORMATS, default="hex", help="output form")
    p.add_argument("-o", "--out", help="write to this file instead of stdout")
    p.add_argument("--clock-mhz", type=float, default=125.0,
                   help="core clock for deadline cycles (regs; default 125)")
    p.add_argument("--core-window", type=int, default=8, help="core parameter W (regs)")
    p.add_argument("--core-elements", type=int, default=64, help="core parameter E (regs)")
    p.add_argument("--core-workers", type=int, default=32, help="core parameter workers (regs)")
    p.add_argument("--core-jobs", type=int, default=2, help="core job-table entries (regs)")
    p.add_argument("--core-tree", action="store_true",
                   help="the core was built with the tree option (regs): a spine's job, "
                        "whose members are child switches, is written with its children "
                        "and total_workers registers (a leaf's is refused without "
                        "--core-leaf)")
    p.add_argument("--core-leaf", action="store_true",
                   help="the core was built with the leaf option as well (regs; implies "
                        "--core-tree): a job with a parent is written with its parent and "
                        "up_index registers, after the parent switch's registers (one "
                        "parent per core; its MAC from --parent-mac)")
    p.add_argument("--parent-mac", default=None, metavar="MAC",
                   help="the parent switch's (or the next hop's) MAC, aa:bb:cc:dd:ee:ff "
                        "(regs, --core-leaf, a job with a parent)")


def control_datagram(cfg, key=None) -> bytes:
    """A CONTROL datagram carrying one job-table entry, sealed with the control key
    (default: the machine's, ``host.switch.keys``) and a fresh nonce."""
    from ina_fabric.protocol.auth import new_nonce, seal
    from ina_fabric.protocol.fields import MsgType
    from ina_fabric.protocol.numpy_view import pack
    from ..switch.keys import switch_key
    return seal(pack(None, type=MsgType.CONTROL, job=cfg.job) + cfg.to_bytes(),
                key or switch_key(create=True), new_nonce())


def render(jobs, fmt, *, clock_mhz=125.0, core_window=8, core_elements=64,
           core_workers=32, core_jobs=2, core_tree=False, core_leaf=False, parent_mac=None):
    """bytes (bin) or str (other formats) for a list of JobConfig."""
    if fmt == "bin":
        return b"".join(len(b).to_bytes(2, "big") + b for b in (j.to_bytes() for j in jobs))
    if fmt == "hex":
        return "".join(j.to_bytes().hex() + "\n" for j in jobs)
    if fmt == "control":
        return "".join(control_datagram(j).hex() + "\n" for j in jobs)
    from ina_fabric.protocol.regs import config_writes, parent_writes
    if len(jobs) > core_jobs:
        raise ValueError(f"{len(jobs)} jobs but the core has {core_jobs} job-table entries")
    lines = []
    parents = {j.parent for j in jobs if j.parent is not None}
    if core_leaf and parents:
        if len(parents) > 1:
            raise ValueError(f"jobs name {len(parents)} parents; a core has one parent switch")
        if parent_mac is None:
            raise ValueError("a job has a parent: give its MAC with --parent-mac")
        parent = parents.pop()
        lines.append(f"# parent switch {parent[0]}:{parent[1]} at {parent_mac}")
        lines += [f"0x{a:04x} 0x{v:08x}" for a, v in parent_writes(parent, parent_mac)]
    for k, j in enumerate(jobs):
        lines.append(f"# job {j.job} -> entry {k}, session 0x{j.session:016x}")
        for addr, val in config_writes(j, k, clock_hz=clock_mhz * 1e6, window_max=core_window,
                                       elements_max=core_elements, workers_max=core_workers,
                                       tree=core_tree or core_leaf, leaf=core_leaf):
            lines.append(f"0x{addr:04x} 0x{val:08x}")
    return "\n".join(lines) + "\n"


def run(args):
    import sys
    from ..cli import CliError
    from ina_fabric.protocol.jobtable import ConfigError, load_jobs_toml
    try:
        jobs = load_jobs_toml(args.config)
        for j in jobs:
            print(f"job {j.job}: session 0x{j.session:016x} (give it to the workers: "
                  f"--session / INA_SESSION)", file=sys.stderr)
        out = render(jobs, args.format, clock_mhz=args.clock_mhz,
                     core_window=args.core_window, core_elements=args.core_elements,
                     core_workers=args.core_workers, core_jobs=args.core_jobs,
                     core_tree=args.core_tree, core_leaf=args.core_leaf,
                     parent_mac=args.parent_mac)
    except (ConfigError, ValueError) as e:
        raise CliError(str(e)) from None
    if args.out:
        mode = "wb" if isinstance(out, bytes) else "w"
        with open(args.out, mode) as fh:
            fh.write(out)
    elif isinstance(out, bytes):
        sys.stdout.buffer.write(out)
    else:
        sys.stdout.write(out)
    return 0
