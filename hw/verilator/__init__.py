"""The INA core in Verilator, behind a C ABI (``build``, ``core``)."""
