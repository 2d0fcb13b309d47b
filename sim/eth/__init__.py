"""cocotb benches for the Ethernet front end and the board datapath (hw/eth, hw/boards)."""
