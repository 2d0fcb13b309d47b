"""INA-Fabric host runtime: wire format, reference switch, transport, collectives, tooling."""

__version__ = "0.1.0"
