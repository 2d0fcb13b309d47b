"""One module per ``ina`` verb (see ``host.cli``)."""
