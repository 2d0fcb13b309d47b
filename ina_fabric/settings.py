"""Every ``INA_*`` environment variable, in one table: what it sets, its flag, its default,
who reads it. ``ina env`` prints it (with the values set in this shell), and a test greps
the code for ``INA_*`` names and checks that each is here.

Precedence, everywhere: an environment variable overrides the argument or flag it
shadows, which overrides the default. Defaults that depend on the path (elements per
packet, staging bytes) are the link's (``ina_fabric.protocol.jobtable.LINK_DEFAULTS``):
``loopback`` when the switch is on this host's loopback (127.0.0.0/8), else ``ethernet``.
"""

from dataclasses import dataclass
import os

__all__ = ["Setting", "SETTINGS", "SCOPES", "NOT_SETTINGS", "by_name", "current", "table",
           "markdown"]


@dataclass(frozen=True)
class Setting:
    name: str
    scope: str          # one of SCOPES
    doc: str
    default: str = ""
    flag: str = ""      # the flag (or argument) it shadows, if any
    read_by: str = ""   # where it is read


#: scope -> what it is for
SCOPES = {
    "job": "a training job through a switch (the torch backend `ina` and the DDP hook)",
    "key": "the switch's control key (CONTROL and STATUS are authenticated)",
    "collectives": "the other collectives of `ina train --backends` (TAR, live switch)",
    "hardware": "the RTL engine and the FPGA build",
    "internal": "set by the tools for their own child processes (not for users)",
    "tests": "the test suite's and the cocotb benches' tiers and knobs",
}

_J, _H = "host/ddp/hook.py (hook_settings)", "host/ddp/backend.py (InaOptions)"

SETTINGS = (
    # -- a job --------------------------------------------------------------------------
    Setting("INA_SWITCH", "job", "the switch's ip:port (required by the backend)", "",
            "switch=", _J),
    Setting("INA_JOB", "job", "job id on the switch (a subgroup adds its index)", "1",
            "job=", _J),
    Setting("INA_MODE", "job", "reliable | bounded | bounded-skip", "reliable", "mode=", _J),
    Setting("INA_ELEMENTS", "job", "int32 elements per packet",
            "16368 on loopback, 256 on Ethernet", "elements= / --elements", _J),
    Setting("INA_WINDOW", "job", "packets in flight per worker (the job's window)", "64",
            "window= / --window", _J),
    Setting("INA_DEADLINE_MS", "job", "bounded mode's slot deadline in ms, or `auto` "
            "(derived from the link and the ranks' timeouts, host/deadline.py)", "5 (auto "
            "in `ina train`)", "deadline= / --deadline-ms", _J),
    Setting("INA_DEADLINE_RULE", "job", "the derived deadline's rule: loss-aware | derived",
            "loss-aware", "deadline_rule= / --slot-deadline-rule", _J),
    Setting("INA_LINK_RATE", "job", "bit/s of the workers' links (derived deadline, pacing)",
            "unknown", "", _J),
    Setting("INA_PACE_RATE", "job", "bit/s the client paces at (0: none)", "INA_LINK_RATE",
            "", _J),
    Setting("INA_CARRY", "job", "1: a bounded worker's left-out contribution goes with its "
            "next call", "0 (1 for bounded-carry)", "carry=", _J),
    Setting("INA_PORT", "job", "a static job: rank r binds this port + r", "any port",
            "bind_port=", _J),
    Setting("INA_SESSION", "job", "a static job's session id (its [[job]] table's)", "",
            "session=", _J),
    Setting("INA_FALLBACK", "job", "no switch answers: raise, or warn and use Gloo",
            "raise (backend), gloo (hook)", "fallback_to_gloo=", _J),
    Setting("INA_WORKER", "job", "the worker's id at its own switch (its index at its "
            "leaf in a tree of switches, docs/fabric.md)", "the rank", "", _J),
    Setting("INA_CONGESTION", "job", "the client's congestion control: aimd | delay | off",
            "aimd", "", _J),
    Setting("INA_ENGINE", "job", "the client's call loop: auto (the compiled one where it "
            "is built) | c | python", "auto", "", _J),
    Setting("INA_GSO", "job", "auto | on | off: the compiled client loop sends a run of "
            "datagrams of one length as one UDP GSO send; auto: once its calls send at "
            "250 Mbit/s or more (docs/congestion.md)", "auto", "", _J),
    Setting("INA_LOCAL_QUEUE", "job", "bytes of datagrams a worker may keep in its host's "
            "own queue, its send buffer (docs/congestion.md)", "128 KB, or 2 ms of its rate",
            "", _J),
    Setting("INA_PRECISION", "job", "the gradients' width on the wire: 32 | 16 | 8 "
            "(int32, int16, int8), optionally :stochastic and/or :hadamard "
            "(docs/precision.md)", "32", "precision= / --precision", _J),
    Setting("INA_TAKEOVER", "job", "1: take over a job id another (crashed) run still "
            "holds (a key holder's explicit takeover)", "0", "", _H),
    Setting("INA_REJOIN_S", "job", "seconds a rank waits for a rejoin round before ending "
            "(0: no rejoin)", "30", "", "host/ddp/train.py"),
    Setting("INA_STATIC_JOB", "job", "1: the switch has the job already (as on the FPGA)",
            "0", "configure=False", _H),
    Setting("INA_DTYPES", "job", "convert (float16/bfloat16 to float32 on the wire; "
            "others to Gloo) | strict (refuse them)", "convert", "", _H),
    Setting("INA_STAGE_BYTES", "job", "bytes per switch call when a tensor is split",
            "64 MiB on loopback, 4 MiB on Ethernet", "", _H),
    Setting("INA_CHECK_SIZES", "job", "how many all_reduce calls have their sizes checked "
            "across ranks (all, or 0)", "8", "", _H),
    # -- the key ---------------------------------------------------------------------------
    Setting("INA_SWITCH_KEY", "key", "the control key, 64 hex digits", "",
            "", "ina_fabric/protocol/keys.py"),
    Setting("INA_SWITCH_KEY_FILE", "key", "file holding the control key",
            "~/.config/ina-fabric/switch.key", "--key-file", "ina_fabric/protocol/keys.py"),
    # -- other collectives -----------------------------------------------------------------
    Setting("INA_TAR_ELEMENTS", "collectives", "TAR: float32 entries per datagram", "2048",
            "", "host/collectives/plugin.py"),
    Setting("INA_TAR_DEADLINE_MS", "collectives", "TAR: a fixed deadline per phase",
            "adaptive", "", "host/collectives/plugin.py"),
    Setting("INA_TAR_CALIBRATION", "collectives", "TAR: the adaptive policy's calibration "
            "rounds", "5", "", "host/collectives/plugin.py"),
    Setting("INA_TAR_LOG", "collectives", "TAR: folder for per-call JSON logs", "none",
            "", "host/collectives/plugin.py"),
    Setting("INA_LIVE_SWITCH", "collectives", "ip:port,ip:port of a LiveSwitch (data, "
            "control)", "", "", "host/collectives/plugin.py"),
    # -- hardware --------------------------------------------------------------------------
    Setting("INA_RTL_PARAMS", "hardware", "the RTL engine's core (CoreParams as JSON)",
            "the default core", "--engine rtl", "host/switch/rtl.py"),
    Setting("INA_RTL_CACHE", "hardware", "where the Verilator builds are cached",
            "build/rtl", "", "hw/verilator/build.py"),
    Setting("INA_NEXTPNR_OPTS", "hardware", "extra nextpnr options for `ina bitstream`",
            "", "", "hw/boards/"),
    # -- internal --------------------------------------------------------------------------
    Setting("INA_LAB", "internal", "the lab id, in a process the lab started", "", "",
            "host/lab/lab.py"),
    Setting("INA_LAB_NODE", "internal", "the node name, in a process the lab started", "",
            "", "host/lab/lab.py"),
    Setting("INA_CONTROL_SPEC", "internal", "a real controller run's spec (JSON), for its "
            "ranks", "", "", "bench/experiments/realrun.py"),
    # -- tests and benches -----------------------------------------------------------------
    Setting("INA_WAVES", "tests", "1: cocotb benches write waveforms", "0", "WAVES=1",
            "sim/common.py"),
    Setting("INA_SIM_FULL", "tests", "1: the long cocotb tier", "0", "", "tests/"),
    Setting("INA_SIM_SEEDS", "tests", "seeds per cocotb coverage run", "jobs", "", "sim/ina"),
    Setting("INA_MUTATION", "tests", "1: the mutation harness", "0", "", "tests/"),
    Setting("INA_LEAF_WORKERS", "tests", "the leaf bench's workers per job, comma-separated",
            "4,3", "", "sim/ina/tb_core.py"),
    Setting("INA_TREE_SCALE", "tests", "1: the tree-of-switches scale tier", "0", "",
            "tests/test_tree_service.py"),
    Setting("INA_TREE_WORKERS", "tests", "the scale tier's workers", "64", "",
            "tests/test_tree_service.py"),
    Setting("INA_TREE_RACK", "tests", "the scale tier's workers per rack", "16", "",
            "tests/test_tree_service.py"),
    Setting("INA_UPSTREAM", "tests", "1: torch's upstream distributed tests, whole "
            "selection", "0", "", "tests/test_torch_upstream.py"),
    Setting("INA_LONG", "tests", "1: the no-hang long tier", "0", "",
            "tests/test_no_hang_stall.py"),
    Setting("INA_TEST_BLOCK", "tests", "comma-separated steps a no-hang CLI test blocks",
            "", "", "tests/test_no_hang_cli.py"),
    Setting("INA_BOARD_TRAIN", "tests", "1: digits training through the board", "0", "",
            "tests/test_switch_board.py"),
    Setting("INA_BENCH", "tests", "a block bench's options (JSON: seed, n, ...)", "{}", "",
            "sim/bench.py"),
    Setting("INA_FABRIC_BENCH", "tests", "1: the fabric lab's bench tier", "0", "",
            "tests/test_lab_fabric.py"),
    Setting("INA_LINE_RATE_SEQS", "tests", "sequences of the board's line-rate test", "250",
            "", "tests/test_eth_board.py"),
    Setting("INA_ERR_CYCLES", "tests", "the ERROR answer interval in cycles of a bench's "
            "core (its scoreboard's)", "the core's default", "", "sim/ina/scoreboard.py"),
    Setting("INA_FLOOD_N", "tests", "refused DATA in the core bench's ERROR flood", "240",
            "", "sim/ina/tb_core.py"),
    Setting("INA_FLOOD_STOP", "tests", "1: the flood must fill the answer queue (the stop "
            "path)", "0", "", "sim/ina/tb_core.py"),
    Setting("INA_PARAMS", "tests", "a cocotb bench's core (CoreParams as JSON)", "", "",
            "sim/ina"),
    Setting("INA_SEED", "tests", "a cocotb bench's traffic seed", "1", "", "sim/ina"),
    Setting("INA_NSEQ", "tests", "a cocotb bench's sequences per job", "100", "", "sim/ina"),
    Setting("INA_DEADLINE", "tests", "a cocotb bench's slot deadline, cycles", "400", "",
            "sim/ina"),
    Setting("INA_E", "tests", "a cocotb bench's elements per packet", "8", "", "sim/ina"),
    Setting("INA_MIN_PACKETS", "tests", "a cocotb bench's least datagrams", "0", "",
            "sim/ina"),
    Setting("INA_MAX_PACKETS", "tests", "a cocotb bench's most datagrams (0: all)", "0", "",
            "sim/ina"),
    Setting("INA_SCENARIO", "tests", "run one named cocotb scenario", "all", "", "sim/ina"),
    Setting("INA_DEBUG", "tests", "1: a cocotb bench prints its datagrams", "0", "",
            "sim/ina"),
    Setting("INA_COV_OUT", "tests", "coverage table JSON path", "none", "", "sim/ina"),
    Setting("INA_COV_NSEQ", "tests", "coverage: sequences per job and seed", "40", "",
            "sim/ina"),
    Setting("INA_NSEQ_B2B", "tests", "back-to-back bench: sequences", "32", "", "sim/ina"),
    Setting("INA_B2B_MCAST", "tests", "back-to-back bench: multicast jobs", "1", "",
            "sim/ina"),
    Setting("INA_B2B_STRICT", "tests", "back-to-back bench: fail on a gap", "1", "",
            "sim/ina"),
    Setting("INA_B2B_OUT", "tests", "back-to-back bench: figures JSON path", "/dev/null",
            "", "sim/ina"),
)

#: INA_* names in the code that are not environment variables
NOT_SETTINGS = {
    "INA_UDP_PORT": "the protocol's UDP port (ina_fabric/protocol/fields.py)",
    "INA_RX": "a stream layout of the gateware (hw/eth/ingress.py)",
    "INA_BACKENDS": "the switch backends of `ina train` (host/ddp/train.py)",
    "INA_CORE_PERIOD_NS": "a cocotb clock period (sim/eth/util.py)",
    "INA_COUNTERS_H": "the generated header's include guard",
    "INA_WIRE_H": "a header's include guard",
}


def by_name() -> dict:
    return {s.name: s for s in SETTINGS}


def current(env=None) -> dict:
    """The table's variables set in ``env`` (default: this process's), by name."""
    env = os.environ if env is None else env
    return {s.name: env[s.name] for s in SETTINGS if s.name in env}


def table(scopes=None, env=None, width=100) -> str:
    """The table as text, one block per scope; a variable set in ``env`` shows its value."""
    now = current(env)
    lines = []
    for scope, what in SCOPES.items():
        if scopes and scope not in scopes:
            continue
        lines.append(f"{scope}: {what}")
        for s in (s for s in SETTINGS if s.scope == scope):
            head = f"  {s.name:20s} {s.doc}"
            lines.append(head)
            extra = [f"default {s.default}" if s.default else "",
                     f"flag {s.flag}" if s.flag else "",
                     f"read by {s.read_by}" if s.read_by else ""]
            lines.append(" " * 23 + "; ".join(x for x in extra if x))
            if s.name in now:
                lines.append(" " * 23 + f"set here: {s.name}={now[s.name]}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def markdown() -> str:
    """docs/settings.md: the table as Markdown (``ina env --markdown`` writes it)."""
    out = ["# Settings: every INA_* environment variable", "",
           "Generated from `ina_fabric/settings.py` by `ina env --markdown > docs/settings.md`"
           " (a test checks it is current). `ina env` prints the same table with the values "
           "set in your shell.", "",
           "An environment variable overrides the argument or flag it shadows, which "
           "overrides the default. Defaults that depend on the path (elements per packet, "
           "staging bytes) are the loopback link's when the switch is on this host's "
           "loopback, else Ethernet's (`LINK_DEFAULTS` in `ina_fabric/protocol/jobtable.py`).",
           ""]
    for scope, what in SCOPES.items():
        out += [f"## {scope}", "", what[0].upper() + what[1:] + ".", "",
                "| variable | what | default | flag or argument | read by |",
                "|---|---|---|---|---|"]
        for s in (s for s in SETTINGS if s.scope == scope):
            cells = [f"`{s.name}`", s.doc, s.default, f"`{s.flag}`" if s.flag else "",
                     f"`{s.read_by}`" if s.read_by else ""]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out)

