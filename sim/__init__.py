"""cocotb benches (run from tests/ by pytest, or by ``python -m ina_fabric.sim.run``)."""
