"""One CLI vocabulary, shared by every verb: sizes, the job's settings, the impairment,
the switch address, ports, and where output goes.

- **Sizes** are bytes. ``K``, ``M``, ``G``, ``T`` mean powers of 1024, written with or
  without ``B`` or ``iB``: ``4M``, ``4MB`` and ``4MiB`` are all 4,194,304 bytes. A plain
  number (``65536``, ``1e9``) is bytes.
- **Deadlines** are milliseconds in every flag (``--deadline-ms``), TOML key
  (``deadline_ms``) and environment variable (``INA_DEADLINE_MS``).
- **Job settings** (``--window``, ``--elements``, ``--deadline-ms``, ``--mode``) default
  to ``ina_fabric.protocol.jobtable.LINK_DEFAULTS`` for the link the verb runs on.
- **Output** goes to ``--out DIR`` (default ``ina-out/<verb>`` under the current
  directory); ``--plot`` draws the figures there too.
"""

import argparse
import pathlib
import re

from ina_fabric.paths import OUT_DIR

__all__ = ["parse_size", "size_arg", "add_job_arguments", "job_settings",
           "add_impairment_arguments", "add_switch_argument", "add_base_port_argument",
           "add_output_arguments", "parse_address", "HelpFormatter", "EXTRAS",
           "missing_extra", "require_extras"]

from ..extras import EXTRAS, missing_extra, require_extras  # noqa: E402,F401

_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgt])?(i?b)?\s*", re.I)


class HelpFormatter(argparse.RawDescriptionHelpFormatter,
                    argparse.ArgumentDefaultsHelpFormatter):
    """Keeps a verb's docstring as written and shows every default in ``--help``."""


def parse_size(text) -> int:
    """Bytes from ``65536``, ``1e9``, ``256K``, ``4M``, ``4MB``, ``4MiB`` (K/M/G/T are
    powers of 1024 in every form). Raises ValueError with the accepted forms."""
    m = _SIZE.fullmatch(str(text))
    if not m or (m.group(3) and m.group(3).lower() == "ib" and not m.group(2)):
        raise ValueError(f"bad size {text!r}: use bytes, e.g. 65536, 1e9, 256K, 4M, 4MB or "
                         f"4MiB (K, M, G, T are powers of 1024)")
    return int(round(float(m.group(1)) * _SUFFIX[(m.group(2) or "").lower()]))


def size_arg(text) -> int:
    """``type=`` for argparse: a size, or a one-line usage error."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_address(text) -> tuple[str, int]:
    host, sep, port = str(text).rpartition(":")
    if not sep or not port.isdigit() or not host or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"bad address {text!r}: expected ip:port "
                                         f"(port 0..65535)")
    return host, int(port)


def add_job_arguments(p, link: str):
    """--window, --elements, --deadline-ms, --mode, defaults from LINK_DEFAULTS[link]."""
    from ina_fabric.protocol.jobtable import LINK_DEFAULTS, MODES
    d = LINK_DEFAULTS[link]
    g = p.add_argument_group(f"job settings (defaults for {link} links)")
    g.add_argument("--window", type=int, default=d.window, help="slots in flight per job")
    g.add_argument("--elements", type=int, default=d.elements,
                   help="int32 elements per packet")
    g.add_argument("--deadline-ms", type=float, default=d.deadline_ms,
                   help="bounded mode: a slot closes this long after it opens")
    g.add_argument("--mode", choices=MODES, default=d.mode)
    return g


def job_settings(args, mode=None):
    """The ``JobSettings`` that add_job_arguments' flags give."""
    from ina_fabric.protocol.jobtable import JobSettings
    return JobSettings(window=args.window, elements=args.elements,
                       deadline=args.deadline_ms / 1e3, mode=mode or args.mode)


def add_impairment_arguments(p):
    g = p.add_argument_group("uplink impairment (userspace, seeded per worker)")
    g.add_argument("--loss", type=float, default=0.0, help="probability a datagram is dropped")
    g.add_argument("--duplicate", type=float, default=0.0,
                   help="probability a datagram is sent twice")
    g.add_argument("--reorder", type=float, default=0.0,
                   help="probability a datagram is held back (reordered)")
    return g


def add_switch_argument(p, what="use this switch (an FPGA or a remote `ina switch`) "
                                "instead of starting a local one"):
    p.add_argument("--switch", metavar="IP:PORT", type=parse_address, help=what)


def add_base_port_argument(p):
    p.add_argument("--base-port", type=int, default=0, metavar="PORT",
                   help="worker w binds PORT+w (0: ephemeral ports, so runs never collide)")


def session_arg(text) -> int:
    """argparse type of a session id (decimal or 0x-hex, 1..2^64-1)."""
    import argparse
    from ina_fabric.protocol.jobtable import ConfigError, parse_session
    try:
        return parse_session(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_session_argument(p, what):
    p.add_argument("--session", type=session_arg, default=None, metavar="ID", help=what)


def add_output_arguments(p, verb: str, plot=True):
    p.add_argument("--out", metavar="DIR", type=pathlib.Path, default=OUT_DIR / verb,
                   help="folder for what this command writes (under the current directory)")
    if plot:
        p.add_argument("--plot", action="store_true", help="also draw the figures (PNG) there")
