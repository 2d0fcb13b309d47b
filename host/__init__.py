"""INA-Fabric host runtime: reference switch, transport, collectives, tooling, ``ina``."""

from ina_fabric import __version__  # noqa: F401
