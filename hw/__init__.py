"""INA-Fabric gateware (Amaranth 0.5)."""
