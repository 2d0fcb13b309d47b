"""RGMII to GMII: the thin DDR wrapper around the vendor I/O primitives.

Everything behind this file is GMII-style (8 bits per clock) and simulates on Icarus;
this file is the only one that needs the FPGA. Bit order follows RGMII v2.0: the rising
edge carries ``rxd[3:0]`` and ``RX_DV``, the falling edge ``rxd[7:4]`` and
``RX_DV xor RX_ER`` (the same for transmit).

Delays. RGMII needs the clock about 2 ns after the data edge, added either in the PHY or
in the FPGA. ``rx_delay_taps`` puts an ECP5 ``DELAYG`` (25 ps per tap) on each receive
data/control input (80 taps = 2 ns); with 0 the inputs go straight into
``io.DDRBuffer``. Transmit data and clock leave through DDR outputs in the same domain;
with ``tx_delay_taps`` 0 the transmit delay is expected from the PHY, otherwise a
``DELAYG`` of that many taps sits between the forwarded clock's ``ODDRX1F`` and its pin
(what LiteX's ECP5 RGMII PHY does for boards whose PHY adds only the receive delay).
The per-port settings for each board live in ``constraints/<board>.toml``.
"""

from amaranth import *
from amaranth.lib import io, wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.lib.wiring import In, Out

__all__ = ["RgmiiPhy"]


def _pin(pins, *names):
    for n in names:
        if hasattr(pins, n):
            return getattr(pins, n)
    raise AttributeError(f"RGMII resource has none of {names}")


class RgmiiPhy(wiring.Component):
    """RGMII pins (``platform.request("eth_rgmii", n, dir="-")``) to GMII signals.

    Creates the clock domain ``rx_domain`` from the PHY's receive clock. The transmit
    side runs in ``tx_domain`` (125 MHz, made by the board top). GMII receive outputs
    ``rx_dv``, ``rx_er``, ``rxd`` are in ``rx_domain``; transmit inputs ``tx_en``,
    ``tx_er``, ``txd`` in ``tx_domain``. ``rst`` resets the receive domain and the PHY.
    """
    rx_dv: Out(1)
    rx_er: Out(1)
    rxd: Out(8)
    tx_en: In(1)
    tx_er: In(1)
    txd: In(8)
    rst: In(1)

    def __init__(self, pins, *, rx_domain, tx_domain, rx_delay_taps=0, tx_delay_taps=0):
        self.pins = pins
        self.rx_domain = rx_domain
        self.tx_domain = tx_domain
        self.rx_delay_taps = rx_delay_taps
        self.tx_delay_taps = tx_delay_taps
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        pins = self.pins

        # Receive clock -> its own domain, reset synchronised into it.
        m.submodules.rx_clk_buf = rx_clk = io.Buffer("i", pins.rx_clk)
        cd_rx = ClockDomain(self.rx_domain)
        m.domains += cd_rx
        m.d.comb += cd_rx.clk.eq(rx_clk.i)
        m.submodules.rx_rst_sync = ResetSynchronizer(self.rst, domain=self.rx_domain)

        # PHY reset (active-low pin, inverted by the resource).
        if hasattr(pins, "rst"):
            m.submodules.phy_rst = phy_rst = io.Buffer("o", pins.rst)
            m.d.comb += phy_rst.o.eq(self.rst)

        # Receive data and control: (rising, falling) pairs.
        rx_ctl = _pin(pins, "rx_ctl", "rx_ctrl")
        rx_lo = Signal(5)   # rising edge: ctl, data[3:0]
        rx_hi = Signal(5)   # falling edge: ctl, data[7:4]
        if self.rx_delay_taps == 0:
            for name, port, lo, hi in (("rx_data", pins.rx_data, rx_lo[:4], rx_hi[:4]),
                                       ("rx_ctl", rx_ctl, rx_lo[4:], rx_hi[4:])):
                buf = io.DDRBuffer("i", port, i_domain=self.rx_domain)
                m.submodules[f"{name}_ddr"] = buf
                m.d.comb += [lo.eq(buf.i[0]), hi.eq(buf.i[1])]
        else:
            for name, port, lo, hi in (("rx_data", pins.rx_data, rx_lo[:4], rx_hi[:4]),
                                       ("rx_ctl", rx_ctl, rx_lo[4:], rx_hi[4:])):
                m.submodules[f"{name}_buf"] = buf = io.Buffer("i", port)
                for bit in range(len(port)):
                    delayed = Signal(name=f"{name}_dly{bit}")
                    m.submodules[f"{name}_delay{bit}"] = Instance(
                        "DELAYG", p_DEL_MODE="USER_DEFINED", p_DEL_VALUE=self.rx_delay_taps,
                        i_A=buf.i[bit], o_Z=delayed)
                    m.submodules[f"{name}_iddr{bit}"] = Instance(
                        "IDDRX1F", i_SCLK=ClockSignal(self.rx_domain), i_RST=Const(0),
                        i_D=delayed, o_Q0=lo[bit], o_Q1=hi[bit])
        rx = self.rx_domain
        m.d[rx] += [
            self.rxd.eq(Cat(rx_lo[:4], rx_hi[:4])),
            self.rx_dv.eq(rx_lo[4]),
            self.rx_er.eq(rx_lo[4] ^ rx_hi[4]),
        ]

        # Transmit: data, control and a forwarded clock, all from the tx domain.
        tx_ctl = _pin(pins, "tx_ctl", "tx_ctrl")
        m.submodules.tx_data_ddr = tx_data = io.DDRBuffer("o", pins.tx_data,
                                                          o_domain=self.tx_domain)
        m.submodules.tx_ctl_ddr = tx_ctl_ddr = io.DDRBuffer("o", tx_ctl,
                                                            o_domain=self.tx_domain)
        m.d.comb += [
            tx_data.o[0].eq(self.txd[:4]), tx_data.o[1].eq(self.txd[4:]),
            tx_ctl_ddr.o[0].eq(self.tx_en), tx_ctl_ddr.o[1].eq(self.tx_en ^ self.tx_er),
        ]
        if self.tx_delay_taps == 0:
            m.submodules.tx_clk_ddr = tx_clk = io.DDRBuffer("o", pins.tx_clk,
                                                            o_domain=self.tx_domain)
            m.d.comb += [tx_clk.o[0].eq(1), tx_clk.o[1].eq(0)]
        else:
            m.submodules.tx_clk_buf = tx_clk = io.Buffer("o", pins.tx_clk)
            clk_ddr, clk_dly = Signal(), Signal()
            m.submodules.tx_clk_oddr = Instance(
                "ODDRX1F", i_SCLK=ClockSignal(self.tx_domain), i_RST=Const(0),
                i_D0=Const(1), i_D1=Const(0), o_Q=clk_ddr)
            m.submodules.tx_clk_delay = Instance(
                "DELAYG", p_DEL_MODE="USER_DEFINED", p_DEL_VALUE=self.tx_delay_taps,
                i_A=clk_ddr, o_Z=clk_dly)
            m.d.comb += tx_clk.o.eq(clk_dly)
        return m
