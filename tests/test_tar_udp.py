"""Transpose AllReduce on 2-4 local ranks: exact without loss (UDP bounded, TCP, ring),
exact loss accounting under injected loss, bad datagrams counted, never fatal."""

import socket

import numpy as np
import pytest

from ina_fabric.host.collectives import DeadlinePolicy, make_collective
from ina_fabric.host.cluster import run_ranks
from ina_fabric.host.collectives.tar import Mesh, TarUdp, TarTcp, RingTcp, shard_bounds
from ina_fabric.host.transport.impair import Impairment

pytestmark = pytest.mark.xdist_group("tar")


def _exact(rank, world, store, sizes, calls, E):
    mesh = Mesh(rank, world, store)
    fixed = lambda: DeadlinePolicy(fixed=2.0)   # never reached: every phase completes
    cols = [TarUdp(mesh, E, fixed(), fixed()), TarTcp(mesh), RingTcp(mesh)]
    mesh.barrier()
    out = []
    for n in sizes:
        for i in range(calls):
            x = (np.arange(n) % 1000 * (rank + 1) + i).astype(np.float32)   # exact in fp32
            for c in cols:
                y, st = c.allreduce(x.reshape(-1, 1) if n % 2 == 0 else x)
                out.append((c.name, n, y.reshape(-1), st["entries_lost"], st.get("late", 0)))
    mesh.barrier()
    mesh.close()
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_exact_without_loss_any_size(world):
    sizes = [1, 2, 5, 257, 3000, 40000]
    res = run_ranks(world, _exact, sizes, 2, 256)
    for rank_out in res:
        for name, n, y, lost, late in rank_out:
            x_sum = sum((np.arange(n) % 1000 * (r + 1)).astype(np.float64) for r in range(world))
            i = 0  # the per-call offset is checked through equality with rank 0 below
            assert lost == 0 and late == 0, name
            assert y.dtype == np.float32 and y.size == n
            assert np.all(y - x_sum >= 0) and np.all((y - x_sum) % world == 0), (name, n)
    for rank_out in res[1:]:            # every rank got bitwise the same result
        for a, b in zip(res[0], rank_out):
            assert np.array_equal(a[2], b[2])


def _lossy(rank, world, store, n, loss, calls, E):
    imp = Impairment(loss=loss, seed=100 + rank)
    mesh = Mesh(rank, world, store, impairment=imp)
    c = TarUdp(mesh, E, DeadlinePolicy(fixed=0.5), DeadlinePolicy(fixed=0.5))
    mesh.barrier()
    rows = []
    for i in range(calls):
        x = np.random.default_rng([rank, i]).standard_normal(n).astype(np.float32)
        y, st = c.allreduce(x)
        rows.append((x, y, st))
    mesh.barrier()
    mesh.close()
    return rows, dict(imp.counts)


def test_bounded_reported_loss_equals_injected():
    world, n, E, calls = 4, 20000, 250, 3
    res = run_ranks(world, _lossy, n, 0.05, calls, E)
    dropped = sum(c["dropped"] for _, c in res)
    seen = sum(c["seen"] for _, c in res)
    lost = sum(st["packets_lost"] for rows, _ in res for _, _, st in rows)
    sent = sum(st["packets_sent"] for rows, _ in res for _, _, st in rows)
    assert dropped > 0 and sent == seen
    assert lost == dropped                        # every injected drop is reported, no more
    assert sum(st["late"] + st["bad"] for rows, _ in res for _, _, st in rows) == 0
    dropped = np.mean([st["dropped_fraction"] for rows, _ in res for _, _, st in rows])
    assert 0.02 < dropped < 0.10                  # tracks the 5% datagram loss
    lo, hi = shard_bounds(n, world)
    for i in range(calls):
        xs = sum(rows[i][0].astype(np.float64) for rows, _ in res)
        for r, (rows, _) in enumerate(res):
            x, y, st = rows[i]
            miss = np.zeros(n, bool)
            for a, ln in st["missing"]:
                miss[a:a + ln] = True
            assert miss.sum() == st["entries_missing"]
            # entries neither missing nor partial are the exact sum
            exact = np.isclose(y, xs, atol=1e-4)
            assert (~exact).sum() <= st["entries_lost"]
            assert st["entries_lost"] == st["entries_missing"] + st["entries_partial"]
            # outside the missing ranges every rank holds the same value
            y0, st0 = res[0][0][i][1], res[0][0][i][2]
            miss0 = np.zeros(n, bool)
            for a, ln in st0["missing"]:
                miss0[a:a + ln] = True
            both = ~miss & ~miss0
            assert np.array_equal(y[both], y0[both])
            # a missing range is filled with N x the local value
            assert np.array_equal(y[miss], world * x[miss])


def _garbage(rank, world, store):
    mesh = Mesh(rank, world, store)
    c = TarUdp(mesh, 64, DeadlinePolicy(fixed=1.0), DeadlinePolicy(fixed=1.0))
    if rank == 1:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for junk in (b"", b"x" * 5, b"\x52\x7a" + b"\x00" * 40, bytes(24 + 7)):
            s.sendto(junk, mesh.udp_addrs[0])
        s.close()
    mesh.barrier()
    x = np.ones(1000, np.float32)
    y, st = c.allreduce(x)
    mesh.barrier()
    mesh.close()
    return y, st["bad"], st["entries_lost"]


def test_bad_datagrams_are_counted_drops():
    (y0, bad0, lost0), (y1, bad1, lost1) = run_ranks(2, _garbage)
    assert np.array_equal(y0, np.full(1000, 2, np.float32)) and np.array_equal(y0, y1)
    assert bad0 == 4 and bad1 == 0 and lost0 == lost1 == 0


def _adaptive(rank, world, store):
    c = make_collective("tar-udp", rank, world, store, calibration=3, elements=512)
    modes = []
    for i in range(7):
        x = np.full(5000, rank + 1, np.float32)
        y, st = c.allreduce(x)
        assert np.array_equal(y, np.full(5000, 3, np.float32)) or st["entries_lost"] > 0
        modes.append(st["mode"])
    c.close()
    return modes, c.sp.deadline() > 0


def test_calibration_runs_over_tcp_then_bounded():
    for modes, ok in run_ranks(2, _adaptive):
        assert modes == ["tcp"] * 4 + ["udp"] * 3 and ok     # warmup + 3 calibration


def test_bad_arguments():
    with pytest.raises(ValueError, match="collective"):
        make_collective("carrier-pigeon", 0, 1, None)


def _resolved(rank, world, store, resolve):
    imp = Impairment(loss=0.08, seed=300 + rank)
    mesh = Mesh(rank, world, store, impairment=imp)
    c = TarUdp(mesh, 200, DeadlinePolicy(fixed=0.3), DeadlinePolicy(fixed=0.3),
               resolve=resolve)
    mesh.barrier()
    rows = []
    for i in range(3):
        x = np.random.default_rng([rank, i]).standard_normal(12000).astype(np.float32)
        y, st = c.allreduce(x)
        rows.append((x, y, st["missing"], st["repaired_chunks"], st["entries_missing"],
                     st["entries_partial"]))
    mesh.barrier()
    mesh.close()
    return rows


@pytest.mark.parametrize("resolve", ["agree", "repair"])
def test_resolved_results_are_identical_on_every_rank(resolve):
    res = run_ranks(4, _resolved, resolve)
    assert sum(r[i][3] for r in res for i in range(3)) > 0      # something was resolved
    for i in range(3):
        xs = sum(r[i][0].astype(np.float64) for r in res)
        y0 = res[0][i][1]
        for r in res:
            x, y, missing, _, ent_missing, ent_partial = r[i]
            assert missing == []                                 # nothing left to drift
            assert np.array_equal(y, y0)                         # bitwise the same
            if resolve == "repair":
                assert ent_missing == 0
                if ent_partial == 0:
                    assert np.allclose(y, xs, atol=1e-4)
            else:
                assert ent_missing == res[0][i][4]               # the same union everywhere


def _agree(rank, world, store, own):
    mesh = Mesh(rank, world, store)
    c = TarUdp(mesh, 64, DeadlinePolicy(fixed=own[rank]), DeadlinePolicy(fixed=own[rank]))
    mesh.barrier()
    _, st = c.allreduce(np.ones(1000, np.float32))
    mesh.barrier()
    mesh.close()
    return st


def test_ranks_use_the_median_of_the_deadlines_their_datagrams_carry():
    """Four ranks with four different own deadlines (never reached: every phase
    completes) all report the same agreed deadline, the median of the four, carried in
    the datagrams' estimate field."""
    own = [0.5, 2.0, 1.0, 1.5]
    res = run_ranks(4, _agree, own)
    for r, st in enumerate(res):
        assert st["scatter_own_deadline"] == own[r]
        assert st["scatter_deadline"] == pytest.approx(1.25)
        assert st["bcast_deadline"] == pytest.approx(1.25)
        assert st["entries_lost"] == 0 and not st["scatter_held"]


def _drops(rank, world, store, calls):
    imp = Impairment(loss=0.15, seed=300 + rank)      # drops only: nothing comes late
    mesh = Mesh(rank, world, store, impairment=imp)
    c = TarUdp(mesh, 100, DeadlinePolicy(calibration=3), DeadlinePolicy(calibration=3))
    mesh.barrier()
    sts = []
    for i in range(calls):
        _, st = c.allreduce(np.ones(2000, np.float32))
        sts.append(st)
    mesh.barrier()
    mesh.close()
    return [(st.get("calibrating", False), st.get("scatter_timed_out"), st.get("late"))
            for st in sts], c.sp.inflate, c.bp.inflate


def test_dropped_datagrams_do_not_inflate_the_deadline():
    """Issue 18, seen on the lab: datagrams dropped in a tbf queue (never late) made every
    bounded round time out lossy, and the policy grew the deadline 1.25x per round up to
    16x (calls of 3-5 s). Rounds that lost data without any late arrival no longer grow
    it: at 15% drop-only loss over 20 bounded calls the inflation stays below 4 (16
    before; what growth remains comes from the first bounded calls, whose deadline
    calibrated over TCP is short enough for some data to arrive late)."""
    res = run_ranks(3, _drops, 24)
    for rows, s_inflate, b_inflate in res:
        bounded = [r for r in rows if not r[0]]
        assert len(bounded) >= 20
        assert sum(1 for r in bounded if r[1]) >= 5          # many rounds did time out
        assert s_inflate < 4 and b_inflate < 4
