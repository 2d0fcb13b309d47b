"""``ina``: the INA-Fabric command line. Each verb is a module in ``host.commands``.

A verb module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args)``;
it keeps heavy imports (torch, amaranth) inside ``run`` so ``ina --help`` stays fast.
"""

import argparse
import importlib
import pkgutil
import sys

from . import commands
from ina_fabric import __version__

__all__ = ["main", "CliError"]


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def _verbs():
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            yield info.name.replace("_", "-"), importlib.import_module(
                f"{commands.__name__}.{info.name}")


def _polish(parser):
    """Every (sub)command: defaults shown in --help, and a description (its help line
    where it has no docstring)."""
    from .commands import HelpFormatter
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if action.help is None and not any(action.default is x for x in
                                           (None, False, True, argparse.SUPPRESS)):
            action.help = action.dest.replace("_", " ")   # a line to show the default on
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if not sub.description:
                    sub.description = helps.get(name)
                _polish(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ina", description="INA-Fabric: in-network gradient aggregation.")
    parser.add_argument("--version", action="version", version=f"ina {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for name, mod in _verbs():
        p = sub.add_parser(name, help=mod.HELP, description=(mod.__doc__ or mod.HELP).strip(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    _polish(parser)
    return parser


def _note_sigint():
    """Record a Ctrl-C (then raise KeyboardInterrupt as Python does): the error a verb
    raises after it (a child that saw the same Ctrl-C first: its switch or worker gone)
    is its consequence, not a failure to report."""
    import signal
    import threading
    seen = []
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return seen, lambda: None

    def on_sigint(signum, frame):
        seen.append(signum)
        raise KeyboardInterrupt
    signal.signal(signal.SIGINT, on_sigint)
    return seen, lambda: signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    interrupted, restore = _note_sigint()
    try:
        return int(args._run(args) or 0)
    except CliError as e:
        if interrupted:             # Ctrl-C, and its consequence in a child: quiet
            return 130
        print(f"ina {args.verb}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as e:     # a verb without its require_extras check
        from .extras import missing_extra
        extra = missing_extra(e.name or "")
        if extra is None:
            raise
        print(f"ina {args.verb}: error: needs the {extra} extra ({e.name} is not "
              f"installed): pip install 'ina-fabric[{extra}]'", file=sys.stderr)
        return 2
    finally:
        restore()


if __name__ == "__main__":
    # run the imported module's main, so commands and this share one CliError class
    from ina_fabric.host.cli import main as _main
    sys.exit(_main())
