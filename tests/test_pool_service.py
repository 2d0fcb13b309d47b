"""The shared slot pool over real sockets (docs/pool.md): `ina switch --pool-slots` with
its parent, two jobs of real workers (``SwitchClient``, threads) on a pool of 2 slots,
every rank the same result as the float sum within the quantization bound, the overflow
counted on both switches; and the flag's one-line errors."""

import os
import secrets
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from ina_fabric.host.switch import query_status
from ina_fabric.protocol.keys import switch_key

INA = [sys.executable, "-m", "ina_fabric.host.cli"]


def _start(listen, cfg, key, extra=()):
    p = subprocess.Popen(INA + ["switch", "--listen", f"127.0.0.1:{listen}", "--config",
                                str(cfg), "--key-file", str(key), "--engine", "fast",
                                *extra], stderr=subprocess.PIPE, text=True)
    k = switch_key(path=str(key))
    for _ in range(400):
        assert p.poll() is None, p.stderr.read()
        try:
            query_status(("127.0.0.1", listen), timeout=0.1, key=k)
            return p
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise AssertionError("switch did not start")


def test_two_jobs_on_a_two_slot_pool_over_sockets(tmp_path, ports):
    from ina_fabric.host.switch import fast
    if not fast.available():
        pytest.skip(fast.WHY_NOT)
    from ina_fabric.host.transport.switch_client import SwitchClient
    leaf, parent, *wp = ports(6)
    sessions = [secrets.randbits(62) | 1 for _ in range(2)]
    lines = []
    for j in range(2):
        lines += ["[[job]]", f"id = {j + 1}",
                  "workers = [%s]" % ", ".join(f'"127.0.0.1:{wp[2 * j + w]}"'
                                               for w in range(2)),
                  "window = 4", "elements = 64", f'session = "0x{sessions[j]:016x}"']
    cfg = tmp_path / "jobs.toml"
    cfg.write_text("\n".join(lines) + "\n")
    key = tmp_path / "k"
    key.write_text(secrets.token_hex(32) + "\n")
    key.chmod(0o600)
    procs = [_start(parent, cfg, key)]
    procs.append(_start(leaf, cfg, key, ["--pool-slots", "2", "--parent",
                                         f"127.0.0.1:{parent}"]))
    n = 64 * 16
    xs = {(j, w): np.random.default_rng([j, w]).standard_normal(n).astype(np.float32)
          for j in range(2) for w in range(2)}
    out, errs = {}, []

    def work(j, w):
        try:
            c = SwitchClient(switch=("127.0.0.1", leaf), job=j + 1, worker=w, nworkers=2,
                             window=4, elements=64, bind=("127.0.0.1", wp[2 * j + w]),
                             session=sessions[j], stall_timeout=30.0)
            for _ in range(2):
                r, _ = c.allreduce(xs[j, w])
            out[j, w] = r
            c.close()
        except Exception as e:        # reported below
            errs.append(e)
    try:
        ts = [threading.Thread(target=work, args=(j, w)) for j in range(2) for w in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        k = switch_key(path=str(key))
        ls = query_status(("127.0.0.1", leaf), timeout=1.0, key=k)
        ps = query_status(("127.0.0.1", parent), timeout=1.0, key=k)
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
    assert not errs
    for j in range(2):
        assert out[j, 0].tobytes() == out[j, 1].tobytes()
        want = xs[j, 0].astype(np.float64) + xs[j, 1]
        assert np.abs(out[j, 0] - want).max() < 1e-3 * np.abs(want).max()
    assert ls["pool"]["slots"] == 2
    assert ls["counters"]["overflow"] > 0
    assert ps["counters"]["overflow_in"] == ls["counters"]["overflow"]
    assert ls["counters"]["relayed"] > 0 and ps["counters"]["results"] > 0


@pytest.mark.parametrize("flags, msg", [
    (["--pool-slots", "4"], "needs --parent"),
    (["--pool-slots", "-1", "--parent", "127.0.0.1:9"], "must be >= 0"),
    (["--pool-slots", "4", "--parent", "127.0.0.1:9", "--engine", "rtl"], "no slot pool"),
])
def test_pool_flag_errors_are_one_line(tmp_path, flags, msg):
    key = tmp_path / "k"
    key.write_text(secrets.token_hex(32) + "\n")
    key.chmod(0o600)
    r = subprocess.run(INA + ["switch", "--listen", "127.0.0.1:0", "--key-file", str(key),
                              *flags], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
