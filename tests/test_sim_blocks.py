"""A cocotb bench for every block: each ``wiring.Component`` of hw/ina and hw/eth driven
alone on Icarus (sim/ina/tb_<block>.py, sim/eth/tb_<block>.py), with a scoreboard from
the reference model or a small model of the block, random idle cycles and (where the
block has a ``ready``) backpressure, over the block's options.

The default suite runs one short parameter set of each (a few seconds each);
``INA_SIM_FULL=1`` adds the others and longer runs.
"""

import importlib
import inspect
import json
import os
import pkgutil

import pytest
from amaranth.lib import wiring

from ina_fabric.sim.common import BUILD, run_cocotb

pytestmark = pytest.mark.xdist_group("sim_blocks")

FULL = bool(os.environ.get("INA_SIM_FULL"))


def _P(**kw):
    from ina_fabric.hw.ina.params import CoreParams
    return CoreParams(**kw)


def _counters(o):
    from ina_fabric.hw.ina.counters import Counters
    return Counters()


def _replay(o):
    from ina_fabric.hw.ina.replay import ReplayStore
    return ReplayStore(o["slots"])


def _hmac(o):
    from ina_fabric.hw.ina.hmac import HmacSha256
    return HmacSha256(bytes.fromhex(o["key"]), max_bytes=2048, addr_shape=range(513))


def _sha(o):
    from ina_fabric.hw.ina.sha256 import Sha256
    return Sha256()


def _beats(o):
    from ina_fabric.sim.eth.tb_stream_blocks import beat_layout
    return beat_layout(o["width"] + (4 if "inputs" in o else 0))


def _skid(o):
    from ina_fabric.hw.eth.words import SkidBuffer
    return SkidBuffer(_beats(o))


def _pfifo(o):
    from ina_fabric.hw.eth.words import PacketFIFO
    return PacketFIFO(_beats(o), o["depth"])


def _arb(o):
    from ina_fabric.hw.eth.words import PacketArbiter
    return PacketArbiter(_beats(o), o["inputs"])


def _b2w(o):
    from ina_fabric.hw.eth.words import BytesToWords
    return BytesToWords()


def _ififo(o):
    from ina_fabric.hw.ina.input_fifo import InputFifo
    return InputFifo(o["lanes"], commit_delay=o["commit_delay"])


def _rq(o):
    from ina_fabric.hw.ina.queue import RequestQueue
    from ina_fabric.sim.ina.tb_request_queue import REQ
    return RequestQueue(REQ, o["depth"])


def _pc(o):
    from ina_fabric.hw.ina.queue import PendingCounts
    return PendingCounts(o["records"], o["max_pending"])


def _udptx(o):
    from ina_fabric.hw.eth.egress import UdpTx
    return UdpTx()


def _router(o):
    from ina_fabric.hw.eth.egress import Router
    return Router()


def _lanes(o):
    from ina_fabric.hw.ina.lanes import LaneCodec, LaneFormat
    return LaneCodec(LaneFormat(o["workers"], tuple(o["widths"])))


def _elem(o):
    from ina_fabric.hw.ina.element import ElementPath
    return ElementPath(_P(**o["core"]), wrapping_adder=o.get("planted") == "wrapping_adder")


def _rules(o):
    from ina_fabric.hw.ina.slot_rules import SlotRules
    return SlotRules(_P(**o["core"]), duplicate_check=o.get("duplicate_check", True)
                     and o.get("planted") != "no_duplicate_check")


def _effects(o):
    from ina_fabric.hw.ina.slot_effects import SlotEffects
    return SlotEffects(_P(**o["core"]))


def _compare(o):
    from ina_fabric.hw.ina.slot_compare import SlotCompare
    return SlotCompare(_P(**o["core"]))


def _issue(o):
    from ina_fabric.hw.ina.slot_issue import SlotIssue
    return SlotIssue(_P(**o["core"]))


def _answer(o):
    from ina_fabric.hw.ina.answer import ErrorAnswer
    return ErrorAnswer(_P(**o["core"]), interval=o["interval"])


def _side(o):
    from ina_fabric.hw.ina.answer import SideMerge
    return SideMerge(o["lanes"])


def _pop(o):
    from ina_fabric.hw.ina.header_pop import HeaderPop
    return HeaderPop(_P(**o["core"]))


def _decode(o):
    from ina_fabric.hw.ina.header_decode import HeaderDecode
    return HeaderDecode(_P(**o["core"]))


def _parser(o):
    from ina_fabric.hw.ina.entry import EntryParser
    return EntryParser(cycles_per_us=o["cycles_per_us"], max_words=512)


def _macrx(o):
    from ina_fabric.hw.eth.mac import MacRx
    return MacRx(max_frame=o["max_frame"])


def _mactx(o):
    from ina_fabric.hw.eth.mac import MacTx
    return MacTx()


def _pbuf(o):
    from ina_fabric.hw.eth.mac import PacketBuffer
    return PacketBuffer(depth=o["depth"])


def _regfile(o):
    from ina_fabric.hw.ina.regfile import RegisterFile
    return RegisterFile(_P(**o["core"]))


def _replicator(o):
    from ina_fabric.hw.ina.replicator import Replicator
    return Replicator(_P(**o["core"]))


def _rgmii(o):
    from ina_fabric.hw.eth.rgmii import RgmiiPhy
    from ina_fabric.sim.eth import tb_rgmii_phy as tb
    phy = RgmiiPhy(tb.Pins(), rx_domain="rx", tx_domain="tx",
                   rx_delay_taps=o["rx_delay_taps"], tx_delay_taps=o["tx_delay_taps"])
    # its DDR primitives: amaranth's ECP5 buffers and the bench's models of them
    phy.bench_sources = tb.sources
    return phy


def _writer(o):
    from ina_fabric.hw.ina.entry import EntryWriter
    return EntryWriter(_P(**o["core"]), max_words=512, reclaim_cycles=o["reclaim"])


def _status(o):
    from ina_fabric.hw.ina.status import StatusWriter
    return StatusWriter(_P(**o["core"]), clock_hz=o["clock_hz"], reclaim_cycles=o["reclaim"],
                        max_words=512)


def _pipeline(o):
    from ina_fabric.hw.ina.header import HeaderPipeline
    return HeaderPipeline(_P(**o["core"]), duplicate_check=o.get("planted")
                          != "no_duplicate_check")


def _control(o):
    from ina_fabric.hw.ina.control import ControlPlane
    from ina_fabric.sim.ina.control_scenario import KEY
    return ControlPlane(_P(**o["core"]), key=KEY, cycles_per_us=1)


def _ingress(o):
    from ina_fabric.hw.eth.ingress import Ingress
    return Ingress()


#: (block class name, factory(options), cocotb module, [options: default first; the rest
#: run with INA_SIM_FULL])
BENCHES = [
    ("Counters", _counters, "ina_fabric.sim.ina.tb_counters",
     [{"n": 150, "idle": 0.3}, {"n": 2000, "idle": 0.0, "density": 1.0, "seed": 2}]),
    ("ReplayStore", _replay, "ina_fabric.sim.ina.tb_replay_store",
     [{"slots": 8, "n": 60}, {"slots": 1, "n": 60}, {"slots": 2, "n": 400, "seed": 3}]),
    ("HmacSha256", _hmac, "ina_fabric.sim.ina.tb_hmac",
     [{"key": bytes(range(32)).hex(), "lengths": [0, 55, 56, 120]},
      {"key": (b"k" * 80).hex(), "seed": 2}]),
    ("Sha256", _sha, "ina_fabric.sim.ina.tb_sha256",
     [{"lengths": [3, 64]}, {"idle": 0.0, "seed": 2}, {"idle": 0.7, "seed": 3}]),
    ("SkidBuffer", _skid, "ina_fabric.sim.eth.tb_skid_buffer",
     [{"width": 8, "n": 40, "idle": 0.3, "bp": 0.3}, {"width": 8, "n": 40, "idle": 0, "bp": 0},
      {"width": 64, "n": 200, "idle": 0.5, "bp": 0.6, "seed": 2}]),
    ("PacketFIFO", _pfifo, "ina_fabric.sim.eth.tb_packet_fifo",
     [{"width": 8, "depth": 8, "n": 30, "idle": 0.3, "bp": 0.3},
      {"width": 32, "depth": 16, "n": 200, "idle": 0.6, "bp": 0.2, "seed": 2},
      {"width": 8, "depth": 4, "n": 100, "idle": 0.0, "bp": 0.7, "seed": 3}]),
    ("PacketArbiter", _arb, "ina_fabric.sim.eth.tb_packet_arbiter",
     [{"width": 8, "inputs": 2, "n": 10, "idle": 0.3, "bp": 0.3},
      {"width": 8, "inputs": 3, "n": 40, "idle": 0.5, "bp": 0.5, "seed": 2},
      {"width": 32, "inputs": 1, "n": 40, "idle": 0.2, "bp": 0.2, "seed": 3}]),
    ("BytesToWords", _b2w, "ina_fabric.sim.eth.tb_bytes_to_words",
     [{"n": 12, "idle": 0.3, "bp": 0.3}, {"n": 100, "idle": 0.0, "bp": 0.0, "seed": 2},
      {"n": 100, "idle": 0.6, "bp": 0.6, "seed": 3}]),
    ("InputFifo", _ififo, "ina_fabric.sim.ina.tb_input_fifo",
     [{"lanes": 1, "commit_delay": 4, "n": 25, "idle": 0.3},
      {"lanes": 4, "commit_delay": 4, "n": 200, "idle": 0.1, "pop_idle": 0.6, "seed": 2},
      {"lanes": 2, "commit_delay": 2, "n": 200, "idle": 0.5, "rewind": 0.2, "seed": 3}]),
    ("RequestQueue", _rq, "ina_fabric.sim.ina.tb_request_queue",
     [{"depth": 4, "n": 300, "idle": 0.3, "bp": 0.4},
      {"depth": 16, "n": 3000, "idle": 0.1, "bp": 0.7, "seed": 2}]),
    ("PendingCounts", _pc, "ina_fabric.sim.ina.tb_pending_counts",
     [{"records": 4, "max_pending": 3, "n": 300, "idle": 0.3},
      {"records": 16, "max_pending": 10, "n": 3000, "idle": 0.1, "seed": 2}]),
    ("UdpTx", _udptx, "ina_fabric.sim.eth.tb_udp_tx",
     [{"n": 6, "idle": 0.3, "bp": 0.3}, {"n": 60, "idle": 0.0, "bp": 0.0, "seed": 2},
      {"n": 60, "idle": 0.6, "bp": 0.6, "seed": 3}]),
    ("Router", _router, "ina_fabric.sim.eth.tb_router",
     [{"n": 20, "prefix": 15, "idle": 0.3, "bp": 0.3},
      {"n": 200, "prefix": 24, "idle": 0.5, "bp": 0.7, "seed": 2}]),
    ("LaneCodec", _lanes, "ina_fabric.sim.ina.tb_lane_codec",
     [{"workers": 32, "widths": [8, 16, 32], "n": 300},
      {"workers": 3, "widths": [16, 32], "n": 2000, "seed": 2},
      {"workers": 1, "widths": [8, 32], "n": 2000, "seed": 3}]),
    ("ElementPath", _elem, "ina_fabric.sim.ina.tb_element_path",
     [{"core": {"workers": 4, "window": 2, "elements": 8, "lanes": 4, "jobs": 2}, "n": 60,
       "idle": 0.2, "records": 2},
      {"core": {"workers": 4, "window": 2, "elements": 8, "lanes": 2, "jobs": 2}, "n": 200,
       "idle": 0.3, "seed": 4},
      {"core": {"workers": 32, "window": 2, "elements": 16, "lanes": 1, "jobs": 2}, "n": 200,
       "idle": 0.2, "records": 2, "seed": 2},
      {"core": {"workers": 8, "window": 4, "elements": 8, "lanes": 8, "jobs": 2}, "n": 200,
       "idle": 0.0, "records": 1, "big": 0.5, "seed": 3},
      {"core": {"workers": 4, "window": 2, "elements": 9, "lanes": 2, "jobs": 2,
                "widths": [8, 16, 32]}, "n": 200, "idle": 0.3, "records": 2, "big": 0.3,
       "seed": 5},
      {"core": {"workers": 32, "window": 2, "elements": 16, "lanes": 1, "jobs": 2,
                "widths": [8, 16, 32]}, "n": 300, "idle": 0.2, "records": 2, "seed": 6},
      {"core": {"workers": 3, "window": 2, "elements": 7, "lanes": 4, "jobs": 2,
                "widths": [16, 32]}, "n": 300, "idle": 0.0, "records": 1, "big": 0.5,
       "seed": 7}]),
    ("SlotRules", _rules, "ina_fabric.sim.ina.tb_slot_rules",
     [{"core": {"workers": 8, "window": 4, "elements": 8, "lanes": 1, "jobs": 2}, "n": 300,
       "idle": 0.2},
      {"core": {"workers": 8, "window": 2, "elements": 8, "lanes": 8, "jobs": 2}, "n": 300,
       "idle": 0.2},
      {"core": {"workers": 32, "window": 8, "elements": 16, "lanes": 4, "jobs": 3}, "n": 3000,
       "idle": 0.1, "seed": 2},
      {"core": {"workers": 4, "window": 2, "elements": 4, "lanes": 8, "jobs": 2}, "n": 3000,
       "idle": 0.1, "seed": 3, "duplicate_check": False}]),
    ("SlotEffects", _effects, "ina_fabric.sim.ina.tb_slot_effects",
     [{"core": {"workers": 8, "window": 4, "elements": 8, "lanes": 1, "jobs": 2}, "n": 300,
       "idle": 0.2},
      {"core": {"workers": 32, "window": 8, "elements": 16, "lanes": 4, "jobs": 3}, "n": 3000,
       "idle": 0.1, "seed": 2}]),
    ("SlotCompare", _compare, "ina_fabric.sim.ina.tb_slot_compare",
     [{"core": {"workers": 8, "window": 4, "elements": 8, "lanes": 1, "jobs": 2}, "n": 300,
       "idle": 0.2},
      {"core": {"workers": 32, "window": 8, "elements": 16, "lanes": 4, "jobs": 3}, "n": 3000,
       "idle": 0.1, "seed": 2},
      {"core": {"workers": 4, "window": 1, "elements": 4, "lanes": 8, "jobs": 2}, "n": 3000,
       "idle": 0.1, "seed": 3}]),
    ("SlotIssue", _issue, "ina_fabric.sim.ina.tb_slot_issue",
     [{"core": {"workers": 8, "window": 2, "elements": 8, "lanes": 1, "jobs": 2}, "n": 400,
       "packets": 0.3, "enables": 0.03},
      {"core": {"workers": 8, "window": 4, "elements": 8, "lanes": 8, "jobs": 3}, "n": 4000,
       "packets": 0.5, "enables": 0.01, "seed": 2},
      {"core": {"workers": 4, "window": 1, "elements": 4, "lanes": 2, "jobs": 2}, "n": 4000,
       "packets": 0.1, "enables": 0.05, "seed": 3}]),
    ("ErrorAnswer", _answer, "ina_fabric.sim.ina.tb_error_answer",
     [{"core": {"workers": 8, "window": 4, "elements": 8, "lanes": 1, "jobs": 2}, "n": 600,
       "interval": 60, "packets": 0.5, "idle": 0.2, "bp": 0.3, "sources": 6, "resets": 0.02,
       "before_wrap": 300, "drain": 600},
      {"core": {"workers": 32, "window": 4, "elements": 16, "lanes": 8, "jobs": 3}, "n": 3000,
       "interval": 1, "packets": 0.9, "idle": 0.0, "bp": 0.9, "sources": 12, "resets": 0.01,
       "before_wrap": 1000, "drain": 3000, "must_stop": True, "seed": 2},
      {"core": {"workers": 4, "window": 2, "elements": 4, "lanes": 4, "jobs": 2}, "n": 3000,
       "interval": 200, "packets": 0.7, "idle": 0.3, "bp": 0.5, "sources": 3, "resets": 0.01,
       "before_wrap": 2000, "drain": 600, "seed": 3}]),
    ("SideMerge", _side, "ina_fabric.sim.ina.tb_side_merge",
     [{"lanes": 1, "n": 30, "idle": 0.4, "bp": 0.3},
      {"lanes": 8, "n": 300, "idle": 0.1, "bp": 0.7, "seed": 2},
      {"lanes": 4, "n": 300, "idle": 0.8, "bp": 0.0, "seed": 3}]),
    ("HeaderPop", _pop, "ina_fabric.sim.ina.tb_header_pop",
     [{"core": {"workers": 8, "window": 4, "elements": 8, "lanes": 2, "jobs": 2}, "n": 30,
       "empty": 0.2, "wait": 0.2},
      {"core": {"workers": 32, "window": 8, "elements": 8, "lanes": 1, "jobs": 3}, "n": 300,
       "empty": 0.3, "wait": 0.1, "seed": 2},
      {"core": {"workers": 8, "window": 2, "elements": 16, "lanes": 8, "jobs": 2}, "n": 300,
       "empty": 0.0, "wait": 0.0, "seed": 3}]),
    ("HeaderDecode", _decode, "ina_fabric.sim.ina.tb_header_decode",
     [{"core": {"workers": 8, "window": 4, "elements": 8, "lanes": 2, "jobs": 2}, "n": 200},
      {"core": {"workers": 32, "window": 8, "elements": 16, "lanes": 1, "jobs": 4}, "n": 2000,
       "seed": 2},
      {"core": {"workers": 3, "window": 1, "elements": 4, "lanes": 8, "jobs": 3}, "n": 2000,
       "seed": 3},
      {"core": {"workers": 8, "window": 2, "elements": 8, "lanes": 1, "jobs": 2,
                "widths": [8, 16, 32]}, "n": 2000, "seed": 4},
      {"core": {"workers": 8, "window": 2, "elements": 8, "lanes": 2, "jobs": 2,
                "widths": [16, 32]}, "n": 2000, "seed": 5}]),
    ("EntryParser", _parser, "ina_fabric.sim.ina.tb_entry_parser",
     [{"cycles_per_us": 3, "n": 25}, {"cycles_per_us": 75, "n": 200, "seed": 2},
      {"cycles_per_us": 1, "n": 300, "seed": 3}]),
    ("MacRx", _macrx, "ina_fabric.sim.eth.tb_mac_rx",
     [{"max_frame": 128, "n": 12}, {"max_frame": 1522, "n": 60, "seed": 2}]),
    ("MacTx", _mactx, "ina_fabric.sim.eth.tb_mac_tx",
     [{"n": 8, "idle": 0.5}, {"n": 60, "idle": 0.0, "seed": 2}, {"n": 60, "idle": 0.9, "seed": 3}]),
    ("PacketBuffer", _pbuf, "ina_fabric.sim.eth.tb_packet_buffer",
     [{"depth": 64, "n": 30, "max_len": 40, "idle": 0.2, "bp": 0.3},
      {"depth": 256, "n": 200, "max_len": 60, "idle": 0.0, "bp": 0.0, "seed": 2,
       "no_overflow": True},
      {"depth": 32, "n": 200, "max_len": 40, "idle": 0.0, "bp": 0.8, "seed": 3}]),
    ("RegisterFile", _regfile, "ina_fabric.sim.ina.tb_register_file",
     [{"core": {"workers": 4, "window": 2, "elements": 8, "lanes": 2, "jobs": 2}, "n": 400,
       "idle": 0.2},
      {"core": {"workers": 32, "window": 8, "elements": 64, "lanes": 1, "jobs": 3,
                "tree": True}, "n": 4000, "idle": 0.1, "seed": 2},
      {"core": {"workers": 3, "window": 1, "elements": 4, "lanes": 8, "jobs": 5}, "n": 4000,
       "idle": 0.5, "writes": 0.8, "seed": 3},
      # a leaf (CoreParams.leaf): the parent registers and the jobs' parent, up_index
      {"core": {"workers": 8, "window": 4, "elements": 8, "lanes": 4, "jobs": 2,
                "tree": True, "leaf": True}, "n": 3000, "idle": 0.2, "seed": 4}]),
    ("Replicator", _replicator, "ina_fabric.sim.ina.tb_replicator",
     [{"core": {"workers": 4, "window": 2, "elements": 8, "lanes": 2, "jobs": 2}, "n": 40,
       "idle": 0.3, "bp": 0.3},
      {"core": {"workers": 32, "window": 4, "elements": 16, "lanes": 1, "jobs": 3}, "n": 60,
       "idle": 0.1, "bp": 0.5, "mcast": 0.2, "seed": 2},
      {"core": {"workers": 3, "window": 1, "elements": 20, "lanes": 8, "jobs": 2}, "n": 300,
       "idle": 0.0, "bp": 0.0, "unicast": 0.5, "seed": 3},
      {"core": {"workers": 8, "window": 2, "elements": 7, "lanes": 4, "jobs": 2}, "n": 300,
       "idle": 0.6, "bp": 0.7, "mcast": 0.6, "seed": 4}]),
    ("RgmiiPhy", _rgmii, "ina_fabric.sim.eth.tb_rgmii_phy",
     [{"rx_delay_taps": 0, "tx_delay_taps": 0, "n": 200},
      {"rx_delay_taps": 80, "tx_delay_taps": 80, "n": 200, "seed": 2},
      {"rx_delay_taps": 0, "tx_delay_taps": 60, "n": 2000, "idle": 0.8, "seed": 3,
       "rx_period_ns": 7.9},
      {"rx_delay_taps": 80, "tx_delay_taps": 0, "n": 2000, "idle": 0.1, "seed": 4,
       "tx_period_ns": 8.1}]),
    ("EntryWriter", _writer, "ina_fabric.sim.ina.tb_entry_writer",
     [{"core": {"workers": 4, "window": 4, "elements": 8, "lanes": 1, "jobs": 2}, "n": 40,
       "reclaim": 40, "accept": 0.05},
      {"core": {"workers": 32, "window": 8, "elements": 64, "lanes": 1, "jobs": 3}, "n": 300,
       "reclaim": 100, "accept": 0.02, "seed": 2},
      {"core": {"workers": 3, "window": 1, "elements": 4, "lanes": 2, "jobs": 4}, "n": 300,
       "reclaim": 20, "accept": 0.2, "seed": 3}]),
    ("StatusWriter", _status, "ina_fabric.sim.ina.tb_status_writer",
     [{"core": {"workers": 4, "window": 4, "elements": 8, "lanes": 2, "jobs": 2}, "n": 12,
       "clock_hz": 1000, "reclaim": 5000, "bp": 0.3},
      {"core": {"workers": 32, "window": 8, "elements": 64, "lanes": 1, "jobs": 4}, "n": 60,
       "clock_hz": 75_000_000, "reclaim": 75_000_000 * 30, "bp": 0.0, "seed": 2},
      {"core": {"workers": 3, "window": 1, "elements": 4, "lanes": 8, "jobs": 3}, "n": 60,
       "clock_hz": 7, "reclaim": 1000, "bp": 0.7, "seed": 3}]),
    ("HeaderPipeline", _pipeline, "ina_fabric.sim.ina.tb_header_pipeline",
     [{"core": {"workers": 4, "window": 2, "elements": 8, "lanes": 2, "jobs": 2}, "n": 12,
       "idle": 0.3, "drain": 0.3},
      {"core": {"workers": 8, "window": 4, "elements": 16, "lanes": 1, "jobs": 2, "queue": 8},
       "n": 60, "window": 4, "idle": 0.1, "drain": 0.1, "send_cycles": 30, "seed": 2},
      {"core": {"workers": 4, "window": 2, "elements": 8, "lanes": 8, "jobs": 3}, "n": 60,
       "idle": 0.0, "drain": 0.5, "deadline": 60, "seed": 3,
       "mix": {"loss": 0.1, "dup": 0.1, "late": 0.1, "bad": 0.1}}]),
    ("ControlPlane", _control, "ina_fabric.sim.ina.tb_control_plane",
     [{"core": {"workers": 4, "window": 4, "elements": 8, "lanes": 2, "jobs": 2}, "n": 10,
       "idle": 0.3, "bp": 0.3},
      {"core": {"workers": 32, "window": 8, "elements": 64, "lanes": 1, "jobs": 2}, "n": 1000,
       "idle": 0.0, "bp": 0.0, "seed": 2},
      {"core": {"workers": 8, "window": 2, "elements": 8, "lanes": 8, "jobs": 3}, "n": 1000,
       "idle": 0.6, "bp": 0.7, "seed": 3}]),
    ("Ingress", _ingress, "ina_fabric.sim.eth.tb_ingress",
     [{"n": 13, "idle": 0.2, "bp": 0.3}, {"n": 150, "idle": 0.0, "bp": 0.0, "seed": 2},
      {"n": 150, "idle": 0.5, "bp": 0.7, "seed": 3}]),
]


def _cases():
    for name, make, module, options in BENCHES:
        for k, o in enumerate(options):
            marks = [] if k == 0 else [pytest.mark.skipif(
                not FULL, reason="long tier: INA_SIM_FULL=1")]
            yield pytest.param(name, make, module, o, id=f"{name}-{k}", marks=marks)


def run_block(name, make, module, options, tag=""):
    """Build block ``name`` with ``options`` and run its bench (AssertionError: it failed).
    ``options["planted"]`` plants that bug in the block (not in the bench's model)."""
    dut = make(options)
    assert type(dut).__name__ == name, f"the bench of {name} builds a {type(dut).__name__}"
    key = "".join(c if c.isalnum() else "_" for c in json.dumps(options, sort_keys=True))
    run = f"blk_{name}_{tag}{abs(hash(key)) % 10 ** 8}"
    top = f"blk_{name.lower()}"
    # (a block with vendor primitives brings its Verilog and the bench's models of them)
    src = getattr(dut, "bench_sources", None)
    run_cocotb(dut if src is None else src(dut, top, BUILD / run), toplevel=top,
               test_module=module, name=run, env={"INA_BENCH": json.dumps(options)})


def bench_of(name):
    """The default (first) bench of block ``name``: ``(name, make, module, options)``."""
    for n, make, module, options in BENCHES:
        if n == name:
            return n, make, module, dict(options[0])
    raise KeyError(name)


@pytest.mark.parametrize("name,make,module,options", list(_cases()))
def test_block_bench(name, make, module, options):
    run_block(name, make, module, options)


def _components():
    """Every ``wiring.Component`` class defined in hw/ina and hw/eth."""
    import ina_fabric.hw.eth as eth
    import ina_fabric.hw.ina as ina
    out = {}
    for pkg in (ina, eth):
        for mod in pkgutil.iter_modules(pkg.__path__):
            if mod.name in ("synth",):
                continue
            m = importlib.import_module(f"{pkg.__name__}.{mod.name}")
            for cname, cls in inspect.getmembers(m, inspect.isclass):
                if (issubclass(cls, wiring.Component) and cls.__module__ == m.__name__):
                    out[cname] = cls
    return out


def test_every_component_has_a_bench_of_its_own():
    """Every Component of hw/ina and hw/eth has a bench of its own (the core's and the
    port's are the system benches), and every bench's block exists."""
    comps = _components()
    assert {"InaCore", "HeaderPipeline", "ControlPlane", "EthPort"} <= set(comps)
    benched = {name for name, *_ in BENCHES} | set(SYSTEM_BENCHES)
    missing = sorted(set(comps) - benched)
    assert not missing, f"Components with no bench of their own: {missing}"
    assert benched <= set(comps), f"benches of no Component: {benched - set(comps)}"


#: blocks whose own bench is a system bench elsewhere: the core (tests/test_sim_ina_core.py,
#: sim/ina/tb_core.py) and the Ethernet port (tests/test_eth_port.py, sim/eth/tb_port.py)
SYSTEM_BENCHES = {"InaCore": "tests/test_sim_ina_core.py", "EthPort": "tests/test_eth_port.py"}
