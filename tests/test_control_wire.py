"""Precision changes real bytes on the wire, and the knobs act on the real training loop
(host/controller/compress.py, bench/experiments/realrun.py)."""

import json
import multiprocessing as mp
import time

import numpy as np
import pytest

from ina_fabric.host.controller.compress import (TokenBucket, decode, encode, expected_sq_error,
                                   message_bytes, quantize, relative_errors)
from ina_fabric.host.controller.knobs import ConfigError
from ina_fabric.host.cluster import free_tcp_port

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("bits", [32, 16, 8, 4])
@pytest.mark.parametrize("n", [1, 1023, 5000, 4097])
def test_roundtrip_and_size(bits, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n)).astype(np.float32)
    msg = encode(x, bits, rng=rng)
    assert msg.size == message_bytes(n, bits)
    y, n2, err = decode(msg, n, bits)
    assert n2 == pytest.approx(float(x.astype(np.float64) @ x), rel=1e-6)
    if bits == 32:
        np.testing.assert_array_equal(x, y)
    else:
        # stochastic rounding: each element within one quantization step of its value
        chunk_max = np.array([np.abs(x[i:i + 1024]).max() for i in range(0, n, 1024)])
        step = np.repeat(chunk_max / (2 ** (bits - 1) - 1), 1024)[:n]
        assert np.all(np.abs(y - x) <= step * (1 + 1e-5) + 1e-30)


def test_bytes_shrink_with_precision():
    n = 100_000
    sizes = {b: message_bytes(n, b) for b in (32, 16, 8, 4)}
    assert sizes[32] == 8 + 4 * n
    for b in (16, 8, 4):
        # q/32 of the float32 size, plus one float32 scale per 1024 elements
        assert sizes[b] == 8 + n * b // 8 + 4 * 98
        assert sizes[b] / sizes[32] == pytest.approx(b / 32 + 1 / 1024, abs=1e-3)


def test_stochastic_rounding_is_unbiased_and_error_formula_is_exact():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(2048).astype(np.float32)
    draws = np.stack([decode(encode(x, 4, rng=rng), x.size, 4)[0] for _ in range(1500)])
    step = np.abs(x).max() / 7
    # mean of 1500 draws: within 5 standard errors (each draw's sd <= step/2)
    assert np.all(np.abs(draws.mean(0) - x) < 5 * step / 2 / np.sqrt(1500) + 1e-6)
    mc = np.mean(np.sum((draws - x) ** 2, axis=1))
    assert expected_sq_error(x, 4) == pytest.approx(mc, rel=0.04)
    r = relative_errors(x)
    assert r[32] == 0.0 and r[16] < r[8] < r[4] < 0.2


def test_bad_input_rejected():
    with pytest.raises(ConfigError, match="precision 12"):
        encode(np.ones(4, np.float32), 12)
    with pytest.raises(ValueError, match="non-finite"):
        quantize(np.array([1.0, np.nan], np.float32), 8)
    msg = encode(np.ones(10, np.float32), 8)
    with pytest.raises(ValueError, match="expected"):
        decode(msg[:-1], 10, 8)


def test_an_unknown_exchange_is_refused():
    from ina_fabric.host.controller.compress import CompressedCollective
    with pytest.raises(ConfigError, match="exchange 'star'"):
        CompressedCollective(0, 2, exchange="star", group=object())


def test_token_bucket_holds_back_to_its_rate():
    tb = TokenBucket(lambda t: 100_000.0, burst=1000)
    t = time.perf_counter()
    tb.take(11_000)                       # 1000 of burst, then 10000 B at 100 kB/s
    assert time.perf_counter() - t >= 0.095
    with pytest.raises(ConfigError, match="must be > 0"):
        TokenBucket(lambda t: -1.0, burst=0).take(10)


def _collective(rank, world, port, **kw):
    """A CompressedCollective on a fresh Gloo group, and this rank's 50,000 values."""
    import torch.distributed as dist
    from ina_fabric.host.controller.compress import CompressedCollective
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    x = np.random.default_rng(rank).standard_normal(50_000).astype(np.float32)
    return CompressedCollective(rank, world, bits=32, seed=1, **kw), x


def _spawn(worker, world, *args):
    """Run ``worker(rank, world, port, queue, *args)`` on ``world`` processes; returns
    what each put on the queue."""
    ctx = mp.get_context("spawn")
    q, port = ctx.Queue(), free_tcp_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, q) + args)
             for r in range(world)]
    for p in procs:
        p.start()
    out = [q.get(timeout=120) for _ in range(world)]
    for p in procs:
        p.join(timeout=30)
    return out


def _exchange_worker(rank, world, port, q, exchange="ring"):
    import torch.distributed as dist
    c, x = _collective(rank, world, port, exchange=exchange)
    out = {}
    for bits in (32, 16, 8, 4):
        c.set_precision(bits)
        total, st = c.allreduce(x)
        m = c.take_measurements()
        out[bits] = (st["bytes"], m["bytes"], total)
    q.put((rank, x, out))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("exchange", ["ring", "direct"])
def test_collective_sends_fewer_bytes_at_lower_precision_and_sums_right(exchange):
    world = 3
    res = dict((r, (x, out)) for r, x, out in _spawn(_exchange_worker, world, exchange))
    exact = sum(res[r][0].astype(np.float64) for r in range(world))
    for r in range(world):
        out = res[r][1]
        sent = {b: out[b][0] for b in out}
        assert sent[32] == (world - 1) * 4 * 50_000            # all-gather: to N-1 peers
        assert sent[16] == (world - 1) * (2 * 50_000 + 4 * 49)
        assert sent[4] / sent[32] == pytest.approx(4 / 32, rel=0.01)
        assert all(out[b][0] == out[b][1] for b in out)        # measured == sent
        np.testing.assert_allclose(out[32][2], exact, rtol=1e-5, atol=1e-4)
        err8 = np.abs(out[8][2] - exact).max()
        err4 = np.abs(out[4][2] - exact).max()
        assert err8 < err4 < 3 * world * 4.5 / 7              # within steps of the chunk max
        # every rank got the same sum
        np.testing.assert_array_equal(out[4][2], res[0][1][4][2])


def _paced_worker(rank, world, port, q, exchange):
    import torch.distributed as dist
    c, x = _collective(rank, world, port, exchange=exchange, link_rate=4e6)
    out = {}
    for pace in (1.0, 0.25):
        c.set_pace(pace)
        t = time.perf_counter()
        total, st = c.allreduce(x)
        wall = time.perf_counter() - t
        out[pace] = (total, wall, c.take_measurements())
    q.put((rank, out))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("exchange", ["ring", "direct"])
def test_a_paced_exchange_spreads_its_bytes_at_the_pace_and_sums_the_same(exchange):
    """The pace knob over real Gloo: 2 peers x 200 KB at a quarter of a 4 MB/s link
    (1 MB/s) takes at least 0.35 s where the unpaced exchange on loopback takes a few
    milliseconds; the sums are bit-identical, and the bandwidth meter leaves the pacer's
    waits out."""
    world = 3
    res = dict(_spawn(_paced_worker, world, exchange))
    for r in range(world):
        (t1, wall1, m1), (tq, wallq, mq) = res[r][1.0], res[r][0.25]
        np.testing.assert_array_equal(t1, tq)
        np.testing.assert_array_equal(tq, res[0][0.25][0])
        sent = (world - 1) * 4 * 50_000
        assert mq["bytes"] == m1["bytes"] == sent
        assert wallq >= (sent - (world - 1) * 16384) / 1e6 * 0.95
        assert m1["pace_wait_s"] == 0.0 and mq["pace_wait_s"] >= 0.1
        # the meter leaves the pacer's waits out; it floors the per-byte time at 1 us
        # where the reused fixed-cost probe (measured on a loaded machine) exceeds what
        # is left of the payload's time (compress.CompressedCollective.allreduce)
        assert mq["byte_s"] == pytest.approx(
            max(mq["seconds"] - mq["fixed_s"] - mq["pace_wait_s"], 1e-6), abs=1e-6)


def test_the_pace_knob_is_checked():
    from ina_fabric.host.controller.compress import CompressedCollective
    c = CompressedCollective(0, 2, group=object(), link_rate=1e6)
    for bad in (0, 1.5, float("nan"), -0.5):
        with pytest.raises(ConfigError, match="pace"):
            c.set_pace(bad)
    with pytest.raises(ConfigError, match="needs the link rate"):
        CompressedCollective(0, 2, group=object()).set_pace(0.5)
    with pytest.raises(ConfigError, match="link_rate"):
        CompressedCollective(0, 2, group=object(), link_rate=0)


def test_knobs_change_bytes_and_accumulation_in_the_training_loop(tmp_path):
    """Real training (host.ddp.run_training, digits, 2 workers): float32 and a=1 for 8
    optimizer steps, then 4 bits and a=4. Bytes per step shrink about 8x, and with a=4
    the loop consumes 4 micro-batches per optimizer step while communicating once."""
    from ina_fabric.bench.experiments.realrun import RealSpec, real_run
    log = tmp_path / "log.json"
    spec = RealSpec(controller="static", capacity=1e9, schedule=[(0.0, 0)],
                    script=[(0, 32, 1), (8, 4, 4, 0.5)], log_path=str(log))
    r = real_run(spec, workers=2, seed=0, control_interval=4, max_epochs=5, target=1.01,
                 max_steps=16, timeout=200)
    assert r.steps == 16
    assert len(set(r.param_hashes)) == 1                      # replicas identical
    entries = json.loads(log.read_text())
    by_step = {e["step"]: e for e in entries}
    # knobs in force during steps 1-8: fp32, a=1; during 9-16: int4, a=4
    assert by_step[8]["precision"] == 4 and by_step[8]["accum"] == 4
    assert by_step[4]["pace"] == 1.0 and by_step[8]["pace"] == by_step[16]["pace"] == 0.5
    assert [k[2:] for k in r.knobs if k[1] == 16] == [(4, 4)]
    per_step_32 = by_step[8]["bytes"] / by_step[8]["steps"]
    per_step_4 = by_step[16]["bytes"] / by_step[16]["steps"]
    assert per_step_4 / per_step_32 == pytest.approx(4 / 32, rel=0.02)
    # one exchange per optimizer step (per bucket), whatever a is
    assert by_step[16]["calls"] == by_step[8]["calls"] and by_step[8]["steps"] == 4
    # 22 micro-batches per epoch per worker (718 samples / 32): 8 steps at a=1 and 8 at
    # a=4 are 40 micro-batches, past the first epoch; 16 steps at a=1 would not be.
    assert by_step[16]["epoch"] == 1 and by_step[8]["epoch"] == 0
