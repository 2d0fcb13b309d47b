"""cocotb benches (run from tests/ by pytest, or by ``python -m sim.run``)."""
