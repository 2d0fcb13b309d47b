"""``ina switch --engine board``: the Versa board's whole datapath in Verilator on a TAP in
a namespace of its own; the kernel's ARP, ping and UDP sockets talk to it.

Default suite (about 90 s here, of which some 20 s start the board; its first build
takes minutes more): ARP and ping answer; an allreduce through the board (job installed
by a sealed CONTROL, reliable mode) is bitwise the one through the software switch.
``INA_BOARD_TRAIN=1``: digits training through the board, replicas bitwise identical to
the same run through the software switch (minutes).
"""

import os
import socket
import struct

import numpy as np
import pytest

KEY = bytes(range(32))     # one key, so the board's build is cached across runs
JOB, WORLD, N = 5, 2, 300  # 300 elements: five packets of the board's 64, the last short


def _skip_reason():
    from ina_fabric.host.switch.board import why_not
    from ina_fabric.host.lab.netns import available
    return why_not() or available()


needs_board = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


class _Peers:
    """Two ranks as InaHookState sees them, this one ``rank``; agree() is the minimum of
    this rank's flag and the other's (2: the job is installed)."""
    def __init__(self, rank):
        self.rank, self.world = rank, 2

    def agree(self, ok):
        return min(ok, 2)


@pytest.mark.parametrize("rank", [0, 1])
def test_probe_asks_the_switch_once(rank, monkeypatch):
    """Only rank 0 sends the start-up STATUS_REQ (a board answers one at a time and
    drops the others as drop_control_busy; every rank asking made three of four fall
    back to Gloo)."""
    import types
    from ina_fabric.host.ddp.hook import InaHookState
    st = InaHookState(types.SimpleNamespace(switch=("198.18.41.2", 19900), job=1),
                      peers=_Peers(rank))
    asked = []
    monkeypatch.setattr(InaHookState, "job_installed", lambda self: asked.append(rank) or True)
    assert st.probe(1, query=True)
    assert asked == ([0] if rank == 0 else [])


def test_board_cache_key_is_the_same_whatever_the_port_order():
    """Amaranth orders a module's ports by set iteration (randomized per process): the
    same design must give the same build key, another design another."""
    from ina_fabric.hw.verilator.board import _canonical
    a = "module top(b, a, c);\n  input a;\n  input b;\n  output c;\nendmodule"
    b = "module top(c, a, b);\n  input b;\n  input a;\n  output c;\nendmodule"
    c = "module top(c, a, b);\n  input b;\n  input a;\n  output [1:0] c;\nendmodule"
    assert _canonical(a) == _canonical(b) != _canonical(c)


@pytest.fixture(scope="module")
def board():
    if _skip_reason():
        pytest.skip(_skip_reason())
    from ina_fabric.host.switch.board import BoardNet
    net = BoardNet(KEY, name=f"inaboard-t{os.getpid()}")
    yield net
    net.close()


def _ping(rank, world, store, netns, ip, count):
    """Echo requests from a raw ICMP socket inside ``netns``; the replies' sequence
    numbers and payloads."""
    from ina_fabric.host.lab.netns import enter
    enter(netns)
    from ina_fabric.host.ddp.hook import local_mac
    from ina_fabric.host.switch.board import TAP_ADDRESS
    macs = (local_mac(TAP_ADDRESS.split("/")[0]), local_mac("127.0.0.1"))
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    s.settimeout(10)
    got = []
    for seq in range(count):
        payload = f"board {seq}".encode()
        body = struct.pack(">BBHHH", 8, 0, 0, 0x41B, seq) + payload
        even = body + b"\0" * (len(body) % 2)
        csum = sum(struct.unpack(f">{len(even) // 2}H", even))
        csum = (csum & 0xFFFF) + (csum >> 16)
        body = body[:2] + struct.pack(">H", ~(csum + (csum >> 16)) & 0xFFFF) + body[4:]
        s.sendto(body, (ip, 0))
        while True:
            data, src = s.recvfrom(2048)
            icmp = data[(data[0] & 15) * 4:]
            if icmp[0] == 0 and struct.unpack(">H", icmp[4:6])[0] == 0x41B:
                got.append((src[0], struct.unpack(">H", icmp[6:8])[0], icmp[8:]))
                break
    return got, macs


@needs_board
def test_board_answers_arp_and_ping(board):
    from ina_fabric.host.cluster import run_ranks
    from ina_fabric.host.lab.netns import ipr
    from ina_fabric.host.switch.board import BOARD_IP
    got, macs = run_ranks(1, _ping, board.netns, BOARD_IP, 3, timeout=120)[0]
    assert got == [(BOARD_IP, k, f"board {k}".encode()) for k in range(3)]
    with ipr(board.netns) as ip:
        neigh = {n.get_attr("NDA_DST"): n.get_attr("NDA_LLADDR") for n in ip.get_neighbours()}
        tap_mac = ip.get_links(ifname="inaboard0")[0].get_attr("IFLA_ADDRESS")
    # what a member's entry carries: the TAP's MAC there, none on loopback
    assert macs == (tap_mac, None)
    from ina_fabric.hw.verilator.board import versa_board
    assert neigh.get(BOARD_IP) == versa_board().mac     # the kernel's ARP, the board's answer


def _status(rank, world, store, netns, switch, key):
    """STATUS from inside ``netns``, as the hook's probe and ``ina switch --status`` ask
    it; the request's size on that route."""
    from ina_fabric.host.lab.netns import enter
    enter(netns)
    from ina_fabric.protocol.control_client import _request_bytes, query_status
    return _request_bytes(tuple(switch)), query_status(tuple(switch), timeout=10, key=key)


@needs_board
def test_board_answers_status_through_a_1500_byte_mtu(board):
    """A STATUS_REQ goes to the board in one IP packet, so the board answers it: padded
    to 2,048 bytes (query_status's size since the per-job counters) it crossed the TAP's
    1,500-byte MTU in two IP fragments, which the board drops (``drop_ip_fragment``), so
    the hook's probe heard nothing and every rank of `make demo-board` fell back to Gloo."""
    from ina_fabric.host.cluster import run_ranks
    size, doc = run_ranks(1, _status, board.netns, board.switch, KEY, timeout=120)[0]
    assert size == 1472
    assert "counters" in doc and isinstance(doc["jobs"], dict)


def test_status_request_fits_one_ip_packet_of_the_route():
    """The STATUS_REQ's size per route MTU: one IPv4 packet, whole words, within what a
    switch answers (1,200..2,048 bytes)."""
    from ina_fabric.protocol.auth import status_length_ok
    from ina_fabric.protocol.control_client import _request_bytes, status_request_bytes
    assert status_request_bytes(1500) == 1472 and status_request_bytes(9000) == 2048
    assert status_request_bytes(65536) == 2048 and status_request_bytes(1000) == 1200
    assert status_request_bytes(1499) == 1468
    assert all(status_length_ok(status_request_bytes(m)) for m in range(576, 9001, 7))
    assert _request_bytes(("127.0.0.1", 19900)) == 2048      # loopback: 64 KiB MTU


def _allreduce(rank, world, store, netns, switch, bind_ip, key, mode):
    """One rank: a SwitchClient bound on ``bind_ip``; rank 0 installs the job with a
    CONTROL sealed with ``key``; two calls; their results."""
    if netns:
        from ina_fabric.host.lab.netns import enter
        enter(netns)
    from ina_fabric.host.ddp.hook import local_mac
    from ina_fabric.host.switch import send_job
    from ina_fabric.host.transport import SwitchClient
    from ina_fabric.protocol.jobtable import JobConfig, new_session
    client = SwitchClient(tuple(switch), JOB, rank, world, 8, 64, mode, bind=(bind_ip, 0),
                          rto=0.2, deadline=0.0002, connect_timeout=30.0)
    mac = local_mac(client.address[0])
    store.set(f"addr{rank}", f"{client.address[0]}:{client.address[1]}"
              + (f"@{mac}" if mac else ""))
    if rank == 0:
        members = tuple(store.get(f"addr{r}").decode() for r in range(world))
        cfg = JobConfig(JOB, members, 8, 64, 0.0002, mode, session=new_session())
        send_job(tuple(switch), cfg, key=key, timeout=10)
        store.set("session", str(cfg.session))
    client.start(int(store.get("session")))
    out = []
    for it in range(2):
        rng = np.random.default_rng([rank, it])
        x = (rng.standard_normal(N) * 10 ** rng.uniform(-3, 3, N)).astype(np.float32)
        y, _ = client.allreduce(x)
        out.append(y.copy())
    client.close()
    return out


@needs_board
def test_board_allreduce_is_bitwise_the_software_switch(board, monkeypatch):
    from ina_fabric.host.cluster import run_ranks
    from ina_fabric.host.switch.board import TAP_ADDRESS
    tap_ip = TAP_ADDRESS.split("/")[0]
    got = run_ranks(WORLD, _allreduce, board.netns, board.switch, tap_ip, KEY, "reliable",
                    timeout=300)
    monkeypatch.setenv("INA_SWITCH_KEY", KEY.hex())
    import multiprocessing as mp
    from ina_fabric.host.cluster import start_switch_process
    addr, proc = start_switch_process(mp.get_context("fork"), engine="model")
    try:
        want = run_ranks(WORLD, _allreduce, None, addr, "127.0.0.1", KEY, "reliable",
                         timeout=120)
    finally:
        proc.terminate()
        proc.join(5)
    for r in range(WORLD):
        for a, b in zip(got[r], want[r]):
            assert a.view(np.uint32).tolist() == b.view(np.uint32).tolist()
        for a, b in zip(got[r], got[0]):
            assert a.view(np.uint32).tolist() == b.view(np.uint32).tolist()


def _wrong_count(rank, world, store, netns, switch, bind_ip, key):
    """One rank: a SwitchClient bound on ``bind_ip`` sending 128 elements per packet to
    a job of 64 (rank 0 installs it); what its allreduce raises, and how soon."""
    import time
    from ina_fabric.host.lab.netns import enter
    enter(netns)
    from ina_fabric.host.ddp.hook import local_mac
    from ina_fabric.host.switch import send_job
    from ina_fabric.host.transport import SwitchClient
    from ina_fabric.protocol.jobtable import JobConfig, new_session
    job = JOB + 1
    client = SwitchClient(tuple(switch), job, rank, world, 8, 128, "reliable",
                          bind=(bind_ip, 0), rto=0.2, connect_timeout=30.0,
                          stall_timeout=30.0)
    mac = local_mac(client.address[0])
    store.set(f"wc{rank}", f"{client.address[0]}:{client.address[1]}"
              + (f"@{mac}" if mac else ""))
    if rank == 0:
        members = tuple(store.get(f"wc{r}").decode() for r in range(world))
        cfg = JobConfig(job, members, 8, 64, 0.0002, "reliable", session=new_session())
        send_job(tuple(switch), cfg, key=key, timeout=10)
        store.set("wc_session", str(cfg.session))
    client.start(int(store.get("wc_session")))
    t0 = time.monotonic()
    try:
        client.allreduce(np.ones(N, np.float32))
        e = None
    except Exception as exc:  # noqa: BLE001 (the test looks at it)
        e = exc
    secs = time.monotonic() - t0
    client.close()
    return type(e).__name__, getattr(e, "reason", None), str(e), secs


@needs_board
def test_board_wrong_element_count_raises_naming_it(board):
    """Issue 43 through the board's gateware: a client sending more elements per packet
    than the job's gets the core's ERROR back through the board's MAC and the kernel
    (BAD_LENGTH, the job's 64) and raises within 5 s on every rank, in one line."""
    from ina_fabric.host.cluster import run_ranks
    from ina_fabric.host.switch.board import TAP_ADDRESS
    from ina_fabric.protocol.fields import Refusal
    tap_ip = TAP_ADDRESS.split("/")[0]
    got = run_ranks(WORLD, _wrong_count, board.netns, board.switch, tap_ip, KEY,
                    timeout=300)
    for name, reason, msg, secs in got:
        assert name == "SwitchRefused" and reason == Refusal.BAD_LENGTH, (name, msg)
        assert secs < 5 and "64 elements" in msg and "\n" not in msg, (secs, msg)


@needs_board
@pytest.mark.skipif(not os.environ.get("INA_BOARD_TRAIN"),
                    reason="training through the simulated board takes many minutes: "
                           "INA_BOARD_TRAIN=1")
@pytest.mark.timeout(7200)
def test_board_training_replicas_are_the_software_switch_s():
    """Digits through the board (the ranks' own CONTROL, the hook's probe) to the
    workload's accuracy, every replica bitwise the same run's through the software
    switch."""
    import dataclasses
    from ina_fabric.host.ddp.train import TrainConfig, run_training
    from ina_fabric.host.switch.board import board_params
    P = board_params()
    base = TrainConfig(workload="digits", workers=4, backend="ina", window=P.window,
                       elements=P.elements, max_epochs=10)
    board = run_training(dataclasses.replace(base, switch_engine="board"), timeout=7000)
    soft = run_training(dataclasses.replace(base, switch_engine="fast"))
    assert board.fallbacks == 0 and board.time_to_accuracy is not None
    assert len(set(board.param_hashes)) == 1
    assert board.param_hashes == soft.param_hashes
    assert board.switch_board["core"]["results"] > 0
    assert board.switch_board["p0_tx_bad_fcs"] == 0


class _FakeBoardSim:
    """What ``BoardSwitch.serve_forever`` asks of ``BoardSim``: a job table of registers
    (``flaky``: every second read of a register returns garbage, as a read while the
    control plane writes the table does), and serve() calls recorded."""

    def __init__(self, regs, flaky=False):
        self.regs, self.flaky, self.reads = regs, flaky, 0
        self.tails, self.cycles = [], 0

    def read_core(self, addr):
        self.reads += 1
        if self.flaky and self.reads % 2 == 0:
            return 0xDEADBEEF
        return self.regs.get(addr, 0)

    def serve(self, fds, seconds, idle_tail, chunk=64):
        self.tails.append(idle_tail)
        self.cycles += 1000         # (the clock ran: frames came)
        if len(self.tails) == 3:
            self.owner.running = False
        return self.cycles

    def stats(self):
        return {"sync_cycles": self.cycles}


def _served_tails(regs, flaky=False):
    from ina_fabric.host.switch.board import BoardSwitch, board_params
    from ina_fabric.hw.verilator.board import SYNC_HZ
    sw = BoardSwitch.__new__(BoardSwitch)        # (no TAP, no Verilator: the loop alone)
    sw.idle_tail, sw.sync_hz, sw.params = int(250e-6 * SYNC_HZ), SYNC_HZ, board_params()
    sw.sim, sw.fd = _FakeBoardSim(regs, flaky), -1
    sw.sim.owner = sw
    sw.serve_forever(install_signals=False)
    return sw.idle_tail, sw.sim.tails


def test_board_clock_runs_until_a_bounded_deadline():
    """With a bounded job enabled, the board's clock runs on after the last frame until
    the job's deadline (and the scanner's round) has passed, so an open slot's PARTIAL
    comes from the board's own deadline; with the clock stopped after the 250 us tail, a
    1 ms deadline was never reached while the ranks waited in wall time (the bounded run
    through the board sent no PARTIAL until the late rank's DATA)."""
    from ina_fabric.hw.verilator.board import CORE_HZ, SYNC_HZ
    from ina_fabric.protocol.regs import job_reg_addr
    deadline = int(1e-3 * CORE_HZ)                          # 1 ms of the core's clock
    regs = {job_reg_addr(1, "enable"): 1, job_reg_addr(1, "bounded"): 1,
            job_reg_addr(1, "deadline"): deadline,
            job_reg_addr(0, "enable"): 1, job_reg_addr(0, "deadline"): 10 * deadline}
    base, tails = _served_tails(regs)
    assert tails[0] == base
    assert tails[1] >= deadline * SYNC_HZ / CORE_HZ > base, tails
    assert tails[1] < 10 * deadline * SYNC_HZ / CORE_HZ    # (job 0 is reliable)
    # no bounded job: the plain tail; a table read mid-write (garbage): the plain tail
    regs[job_reg_addr(1, "bounded")] = 0
    assert _served_tails(regs)[1] == [base] * 3
    regs[job_reg_addr(1, "bounded")] = 1
    assert _served_tails(regs, flaky=True)[1] == [base] * 3
    # an absurd deadline is capped
    regs[job_reg_addr(1, "deadline")] = (1 << 31) - 1
    from ina_fabric.host.switch.board import BoardSwitch
    assert _served_tails(regs)[1][1] == int(BoardSwitch.MAX_TAIL_S * SYNC_HZ)


def test_train_gives_a_board_run_two_hours():
    """``ina train --engine board`` waits 7,200 s for a run, not the 1,800 s of the others:
    `make demo-board` at load ~20 took 31 min for 9 epochs and was stopped one epoch short
    of the target ("training did not finish within 1800s"). ``--timeout`` overrides it,
    and a bad one is a one-line error."""
    import argparse
    from ina_fabric.host.cli import CliError
    from ina_fabric.host.commands import train
    p = argparse.ArgumentParser()
    train.add_arguments(p)
    assert train.run_timeout(p.parse_args(["--engine", "board"])) == 7200
    assert train.run_timeout(p.parse_args([])) == 1800
    assert train.run_timeout(p.parse_args(["--engine", "board", "--timeout", "60"])) == 60
    with pytest.raises(CliError, match="--timeout 0: must be > 0"):
        train.run_timeout(p.parse_args(["--timeout", "0"]))
