"""The switch's control key (``ina_fabric.protocol.keys``, where the gateware build finds it
too: hw/ may not import host/)."""

from ina_fabric.protocol.keys import switch_key, default_key_path, KeyMissing

__all__ = ["switch_key", "default_key_path", "KeyMissing"]
