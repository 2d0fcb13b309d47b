"""FPGA top for ECP5 boards with RGMII PHYs: PLL, reset, RGMII wrappers, the datapath, LEDs.

The datapath (hw/boards/datapath.py) is GMII-side and simulated; this file adds only
what needs the FPGA: the ``EHXPLLL`` for the core clock, the DDR I/O of each RGMII port
(hw/eth/rgmii.py), and LEDs (per port: link, activity, error).
"""

from amaranth import *
from amaranth.lib.cdc import AsyncFFSynchronizer, FFSynchronizer, ResetSynchronizer

from ina_fabric.hw.eth.rgmii import RgmiiPhy

from .datapath import InaDatapath

__all__ = ["Ecp5RgmiiTop", "clock_plan", "pll_params"]


def pll_params(fin_mhz: float, fout_mhz: float):
    """EHXPLLL dividers for one output (the search ``ecppll`` does): CLKI_DIV, CLKFB_DIV,
    CLKOP_DIV with the VCO in 400..800 MHz and the PFD >= 3.125 MHz."""
    best = None
    for ref in range(1, 129):
        if fin_mhz / ref < 3.125:
            break
        for fb in range(1, 81):
            pfd = fin_mhz / ref
            for op in range(1, 129):
                vco = pfd * fb * op
                if not 400 <= vco <= 800:
                    continue
                err = abs(pfd * fb - fout_mhz)
                if best is None or err < best[0]:
                    best = (err, ref, fb, op)
    _, ref, fb, op = best
    return ref, fb, op


def clock_plan(fin_mhz: float, sync_mhz: float, core_mhz: float):
    """EHXPLLL dividers (CLKI_DIV, CLKFB_DIV, CLKOP_DIV, CLKOS_DIV) for ``sync`` on CLKOP
    and ``core`` on CLKOS from one input clock. CLKOP feeds back, so VCO = sync *
    CLKOP_DIV: the divider is the one that also gives the core clock as VCO / integer
    (125 and 75 MHz: VCO 750 MHz, /6 and /10; from 100 MHz or 25 MHz alike)."""
    ref, fb, _ = pll_params(fin_mhz, sync_mhz)
    fop = fin_mhz / ref * fb
    for op in range(1, 129):
        vco = fop * op
        os_div = round(vco / core_mhz)
        if 400 <= vco <= 800 and os_div >= 1 and abs(vco / os_div - core_mhz) < 1e-6:
            return ref, fb, op, os_div
    raise ValueError(f"no VCO gives {sync_mhz} and {core_mhz} MHz from {fin_mhz} MHz")


class _Stretch(Elaboratable):
    """Holds ``o`` high for 2**bits cycles after a pulse on ``i`` (LED blink)."""

    def __init__(self, bits=22):
        self.i = Signal()
        self.o = Signal()
        self.bits = bits

    def elaborate(self, platform):
        m = Module()
        cnt = Signal(self.bits)
        # (the pulse is registered first: it comes from anywhere in the datapath, and
        # an LED is no reason for a long route to count as a timing path)
        i = Signal()
        m.d.sync += i.eq(self.i)
        with m.If(i):
            m.d.sync += cnt.eq(~0)
        with m.Elif(cnt != 0):
            m.d.sync += cnt.eq(cnt - 1)
        m.d.comb += self.o.eq(cnt != 0)
        return m


class Ecp5RgmiiTop(Elaboratable):
    """``board``: BoardConfig; ``ports``: {port: RgmiiPhy delay keywords
    (``rx_delay_taps``, ``tx_delay_taps``)}, port 0 alone on a one-port board; ``clk``:
    (resource name, MHz) of the input clock. LEDs: 4 per port, as many as the board has."""

    def __init__(self, board, ports, *, clk=("clk100", 100), sync_mhz=125, core_mhz=75,
                 reset_dcc=None):
        self.board = board
        self.reset_dcc = reset_dcc
        self.ports = ports
        self.clk = clk
        self.sync_mhz = sync_mhz
        self.core_mhz = core_mhz

    def elaborate(self, platform):
        m = Module()
        # -- clocks and reset -----------------------------------------------------------
        clk_name, fin = self.clk
        clk_in = platform.request(clk_name, dir="i").i
        ref, fb, op, os_div = clock_plan(fin, self.sync_mhz, self.core_mhz)
        clk_core = Signal()     # CLKOP: sync (front end) and RGMII transmit
        clk_ina = Signal()      # CLKOS: the INA core's domain
        locked = Signal()
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI=str(fin), a_FREQUENCY_PIN_CLKOP=str(self.sync_mhz),
            a_FREQUENCY_PIN_CLKOS=str(self.core_mhz),
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
            p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD",
            p_CLKI_DIV=ref, p_CLKOP_ENABLE="ENABLED", p_CLKOP_DIV=op,
            p_CLKOP_CPHASE=op - 1, p_CLKOP_FPHASE=0,
            p_CLKOS_ENABLE="ENABLED", p_CLKOS_DIV=os_div, p_CLKOS_CPHASE=os_div - 1,
            p_CLKOS_FPHASE=0, o_CLKOS=clk_ina, i_ENCLKOS=0, p_FEEDBK_PATH="CLKOP", p_CLKFB_DIV=fb,
            i_RST=0, i_STDBY=0, i_CLKI=clk_in, o_CLKOP=clk_core, i_CLKFB=clk_core,
            i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1, i_PHASESTEP=1,
            i_PHASELOADREG=1, i_PLLWAKESYNC=0, i_ENCLKOP=0, o_LOCK=locked)

        rst_btn = platform.request("rst", dir="i").i if _has(platform, "rst") else C(0)
        rst = Signal()
        m.d.comb += rst.eq(~locked | rst_btn)
        m.domains.sync = cd_sync = ClockDomain("sync")
        m.d.comb += cd_sync.clk.eq(clk_core)
        # The front end's reset reaches thousands of flip-flops across the chip; over
        # fabric routing it alone took 9 ns (of 8). It is released synchronously as by
        # ResetSynchronizer, then driven through a DCCA onto a global network, which
        # nextpnr routes to the flip-flops' LSR inputs.
        rst_sync = Signal(init=1)
        m.submodules.rst_sync = AsyncFFSynchronizer(rst, rst_sync, o_domain="sync")
        # (``reset_dcc``: the DCCA's bel, e.g. "X3/Y34/LDCC5", where a board's file names
        # one: nextpnr's own choice can be a DCCA whose input some placements cannot reach)
        at = {"a_BEL": self.reset_dcc} if self.reset_dcc else {}
        m.submodules.rst_gbuf = Instance("DCCA", i_CLKI=rst_sync, i_CE=1, o_CLKO=cd_sync.rst,
                                         **at)
        m.domains.core = cd_ina = ClockDomain("core")
        m.d.comb += cd_ina.clk.eq(clk_ina)
        m.submodules.core_rst_sync = ResetSynchronizer(rst, domain="core")

        # PHY reset: held ~16 ms (2**21 core cycles) after the PLL locks or the button is
        # released, as the PHYs' datasheets ask (>= 10 ms).
        phy_rst_cnt = Signal(21)
        phy_rst = Signal(init=1)
        with m.If(phy_rst_cnt != (1 << 21) - 1):
            m.d.sync += phy_rst_cnt.eq(phy_rst_cnt + 1)
        with m.Else():
            m.d.sync += phy_rst.eq(0)

        # -- datapath and PHYs ------------------------------------------------------------
        m.submodules.dp = dp = InaDatapath(self.board)
        for p, delays in self.ports.items():
            cd_tx = ClockDomain(f"eth_tx{p}")
            m.domains += cd_tx
            # The transmit domains run on the front end's clock, so they take its
            # global reset. (Each with a ResetSynchronizer of its own, yosys merged
            # those flip-flops with the one that feeds the DCCA; the placer then put that
            # flip-flop beside the transmit logic, and on some placements nothing could
            # route it to the DCCA at the top of the chip.)
            m.d.comb += [cd_tx.clk.eq(clk_core), cd_tx.rst.eq(cd_sync.rst)]
            pins = platform.request("eth_rgmii", p, dir="-")
            phy = RgmiiPhy(pins, rx_domain=f"eth_rx{p}", tx_domain=f"eth_tx{p}", **delays)
            m.submodules[f"rgmii{p}"] = phy
            m.d.comb += [
                phy.rst.eq(rst | phy_rst),
                getattr(dp, f"p{p}_rx_dv").eq(phy.rx_dv),
                getattr(dp, f"p{p}_rx_er").eq(phy.rx_er),
                getattr(dp, f"p{p}_rxd").eq(phy.rxd),
                phy.tx_en.eq(getattr(dp, f"p{p}_tx_en")),
                phy.tx_er.eq(getattr(dp, f"p{p}_tx_er")),
                phy.txd.eq(getattr(dp, f"p{p}_txd")),
            ]
        for p in (0, 1):
            if p not in self.ports:   # a one-port board: the second port stays idle
                m.domains += ClockDomain(f"eth_rx{p}")
                m.domains += ClockDomain(f"eth_tx{p}")
                m.d.comb += [ClockSignal(f"eth_rx{p}").eq(clk_core),
                             ClockSignal(f"eth_tx{p}").eq(clk_core),
                             ResetSignal(f"eth_rx{p}").eq(1), ResetSignal(f"eth_tx{p}").eq(1)]

        # -- LEDs: per port link (receive clock alive), rx/tx activity, error ---------------
        leds = []
        for p in sorted(self.ports):
            toggle = Signal(name=f"rx_toggle{p}")
            m.d[f"eth_rx{p}"] += toggle.eq(~toggle)
            seen = Signal(name=f"rx_toggle_sync{p}")
            m.submodules[f"link_sync{p}"] = FFSynchronizer(toggle, seen)
            seen_prev = Signal(name=f"rx_toggle_prev{p}")
            m.d.sync += seen_prev.eq(seen)
            link = _Stretch(16)
            m.submodules[f"link{p}"] = link
            m.d.comb += link.i.eq(seen != seen_prev)
            outs = [link.o]
            for name in ("rx_activity", "tx_activity", "error"):
                s = _Stretch()
                m.submodules[f"{name}{p}"] = s
                m.d.comb += s.i.eq(getattr(dp, f"p{p}_{name}"))
                outs.append(s.o)
            leds += outs
        for k, value in enumerate(leds):
            if _has(platform, "led", k):
                m.d.comb += platform.request("led", k).o.eq(value)
            elif _has(platform, "rgb_led", k):    # the ECPIX-5's four: their green parts
                m.d.comb += platform.request("rgb_led", k).g.o.eq(value)
            else:
                break
        return m


def _has(platform, name, number=0):
    try:
        platform.lookup(name, number)
        return True
    except Exception:
        return False
