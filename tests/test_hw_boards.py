"""Every board `python -m ina_fabric.hw.build` knows: its constraints load, its pins can
be requested as the board top requests them, its PLL gives the clocks it asks for, and
its core fits the jobs. No synthesis or place-and-route here (CI builds the bitstreams)."""

import pytest

from ina_fabric.hw.boards.ecp5_rgmii import clock_plan
from ina_fabric.hw.build import BOARDS, board_config


@pytest.mark.parametrize("board", sorted(BOARDS))
def test_board_pins_clocks_and_constraints(board):
    factory, _ = BOARDS[board]
    platform, (clk_name, fin) = factory()
    cfg, ports, c = board_config(board)
    assert 0 in ports and set(ports) <= {0, 1}, "port 0 (workers), port 1 (uplink) if any"
    assert fin == c["clocks"]["input_mhz"]
    # as Ecp5RgmiiTop requests them; two resources sharing a pin would raise here
    platform.request(clk_name, dir="i")
    for p in sorted(ports):
        pins = platform.request("eth_rgmii", p, dir="-")
        for names in (("rx_clk",), ("rx_ctl", "rx_ctrl"), ("rx_data",), ("tx_clk",),
                      ("tx_ctl", "tx_ctrl"), ("tx_data",)):
            assert any(hasattr(pins, n) for n in names), f"{board} eth_rgmii {p}: {names}"

    assert any(platform.lookup(name, 0) for name in ("led", "rgb_led")
               if name in {r for r, _ in platform.resources}), "a link LED at least"

    ref, fb, op, os_div = clock_plan(fin, c["clocks"]["sync_mhz"], c["clocks"]["core_mhz"])
    vco = fin / ref * fb * op
    assert 400 <= vco <= 800 and fin / ref >= 3.125
    assert vco / op == pytest.approx(c["clocks"]["sync_mhz"])
    assert vco / os_div == pytest.approx(c["clocks"]["core_mhz"])
    assert cfg.clock_hz == c["clocks"]["core_mhz"] * 1e6
    # the default core's size unless the board's [core] table shrinks it
    for key, value in c.get("core", {}).items():
        assert getattr(cfg.params, key) == value
    assert cfg.writes()[0][1] == cfg.ip_int


def test_colorlight_ports_share_one_phy_reset():
    """The 5A-75B's PHYs share reset and MDIO pins: port 0 keeps them, port 1 not."""
    platform, _ = BOARDS["colorlight_5a75b"][0]()
    p0 = platform.request("eth_rgmii", 0, dir="-")
    p1 = platform.request("eth_rgmii", 1, dir="-")
    assert hasattr(p0, "rst") and not hasattr(p1, "rst") and not hasattr(p1, "mdio")
