"""One module per ``ina`` verb (see ``host.cli``)."""

# the shared CLI vocabulary (``_common``), for the CLI and the benches' own flags
from ._common import HelpFormatter, parse_size, size_arg, parse_address  # noqa: E402

__all__ = ["HelpFormatter", "parse_size", "size_arg", "parse_address"]
