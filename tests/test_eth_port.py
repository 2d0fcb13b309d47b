"""cocotb on Icarus: one Ethernet port (MAC, FCS, drops, ARP, ICMP echo, INA in/out)."""

import pytest

from ina_fabric.sim.common import run_cocotb


@pytest.mark.xdist_group("eth_port")
def test_eth_port():
    from ina_fabric.hw.eth.port import EthPort
    run_cocotb(EthPort(rx_domain="eth_rx0", tx_domain="eth_tx0"), toplevel="eth_port",
               test_module="ina_fabric.sim.eth.tb_port", name="eth_port")
