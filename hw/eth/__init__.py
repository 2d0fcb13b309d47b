"""Gigabit Ethernet for the board: GMII MAC (FCS, drops), RGMII DDR wrapper, and the
Ethernet/IPv4/UDP front end (ARP, ICMP echo, INA datagrams to and from the core)."""
