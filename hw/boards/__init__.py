"""Board top levels: the two-port INA datapath (GMII, simulates on Icarus) and the
FPGA tops that wrap it with RGMII, clocks and LEDs."""
