"""4 worker processes and `ina switch` on loopback: sums within the quantization bound,
exact recovery under loss in reliable mode, exact loss accounting in bounded mode."""

import subprocess
import sys
import time

import numpy as np
import pytest

from ina_fabric.host.cluster import LocalCluster, WorkerSpec
from ina_fabric.protocol import unpack, MsgType
from ina_fabric.host.switch import query_status
from ina_fabric.host.transport import SwitchClient, SwitchUnavailable, Impairment
from ina_fabric.protocol.jobtable import job_defaults

SESSION = 0x5EED_0F_7E57  # the static job's session id (ina switch --session)


def start_switch(sport, base, n, mode="reliable", deadline_ms=5.0, elements=1024):
    proc = subprocess.Popen([sys.executable, "-m", "ina_fabric.host.cli", "switch", "--listen",
                             f"127.0.0.1:{sport}", "--local-workers", str(n), "--base-port",
                             str(base), "--mode", mode, "--deadline-ms", str(deadline_ms),
                             "--elements", str(elements), "--session", hex(SESSION)],
                            stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            query_status(("127.0.0.1", sport), timeout=0.1)
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("switch did not start")


def run(ports, n, size, mode="reliable", deadline_ms=5.0, **impair):
    from conftest import consecutive_free_ports
    sport, = ports(1)
    base = consecutive_free_ports(n)
    proc = start_switch(sport, base, n, mode, deadline_ms)
    try:
        spec = WorkerSpec(nworkers=n, base_port=base, seed=7, session=SESSION,
                          settings=job_defaults("loopback", mode=mode, elements=1024,
                                                deadline=deadline_ms / 1e3),
                          impairment=Impairment(**impair))
        with LocalCluster(spec, switch=f"127.0.0.1:{sport}", timeout=240) as cluster:
            res = cluster.allreduce_check(size, 1)
        res["switch"] = query_status(("127.0.0.1", sport))["counters"]
    finally:
        proc.terminate()
        proc.wait()
    return res


@pytest.mark.xdist_group("loopback")
def test_4_workers_4M_within_bound(ports):
    res = run(ports, 4, 4 << 20)
    assert res["within_bound"], res["bound_ratio"]
    assert res["stats"]["partial_slots"] == 0 and res["stats"]["entries_lost"] == 0


@pytest.mark.xdist_group("loopback")
def test_reliable_under_loss_duplicates_reordering_is_exact(ports):
    res = run(ports, 4, 1 << 20, loss=0.02, duplicate=0.02, reorder=0.02)
    assert res["within_bound"], res["bound_ratio"]
    dropped = sum(r["impairment"]["dropped"] for r in res["per_worker"])
    assert dropped > 0 and res["stats"]["retransmits"] > 0
    assert res["stats"]["entries_lost"] == 0


@pytest.mark.xdist_group("loopback")
def test_bounded_reported_loss_equals_injected(ports):
    # a deadline far above any scheduling delay, so that only injected drops (not a
    # descheduled worker on a busy machine) make partial slots
    n, size = 4, 1 << 18
    res = run(ports, n, size, mode="bounded", deadline_ms=1000.0, loss=0.02)
    first_tx_drops = set()
    for r in res["per_worker"]:
        for hdr in r["dropped"]:
            h, _ = unpack(hdr + bytes(4 * 0))
            if h["type"] == MsgType.DATA and not h["flags"] & 0x04 and h["nelem"]:
                first_tx_drops.add((int(h["seq"]), int(h["nelem"])))
    injected_entries = sum(nel for _, nel in first_tx_drops)
    assert injected_entries > 0
    lost = [r["stats"]["entries_lost"] for r in res["per_worker"]]
    assert lost == [lost[0]] * n                   # every worker reports the same loss
    # bounded re-sends go out on the RTT's timeout (issue 18, run 4; before, only after
    # 1.5 deadlines), so a dropped DATA is re-sent well within this 1 s deadline and
    # its slot completes: what is lost is at most what was injected (a slot closes
    # partial only if a re-send was dropped too)
    assert lost[0] <= injected_entries
    assert res["stats"]["retransmits"] > 0
    assert res["stats"]["abandoned_slots"] == 0


def test_no_switch_raises_clearly(ports):
    sport, wport = ports(2)
    with SwitchClient(("127.0.0.1", sport), 1, 0, 2, bind=("127.0.0.1", wport),
                      connect_timeout=0.3, session=1) as c:
        with pytest.raises(SwitchUnavailable, match="no answer from switch"):
            c.allreduce(np.ones(100, np.float32))


def test_bad_switch_address():
    with pytest.raises(ValueError, match="bad switch address"):
        SwitchClient(("no.such.host.invalid", 1), 1, 0, 2)
