"""``ina env``: every INA_* environment variable, its flag and default, and what is set here.

The table is ``ina_fabric.settings.SETTINGS`` (one place in the code). An environment
variable overrides the argument or flag it shadows; defaults that depend on the path
(elements per packet, staging bytes) are the loopback link's when the switch is on this
host's loopback, else Ethernet's.

    ina env                     the whole table, grouped by scope
    ina env --scope job         one scope (job, key, collectives, hardware, internal, tests)
    ina env --set               only the variables set in this shell
    ina env --json              the table as JSON
    ina env --markdown          the table as Markdown (docs/settings.md)
"""

HELP = "every INA_* environment variable: flag, default, what is set here"


def add_arguments(p):
    from ina_fabric.settings import SCOPES
    p.add_argument("--scope", action="append", choices=sorted(SCOPES),
                   help="only this scope (repeatable)")
    p.add_argument("--set", action="store_true", help="only the variables set here")
    p.add_argument("--json", action="store_true", help="the table as JSON")
    p.add_argument("--markdown", action="store_true",
                   help="the table as Markdown (what docs/settings.md holds)")


def run(args):
    import dataclasses
    import json
    from ina_fabric.settings import SETTINGS, current, table, markdown
    if args.markdown:
        print(markdown(), end="")
        return 0
    if args.set:
        now = current()
        for name, value in now.items():
            print(f"{name}={value}")
        if not now:
            print("no INA_* variable is set")
        return 0
    if args.json:
        rows = [dataclasses.asdict(s) for s in SETTINGS
                if not args.scope or s.scope in args.scope]
        print(json.dumps(rows, indent=1))
        return 0
    print(table(args.scope), end="")
    return 0
