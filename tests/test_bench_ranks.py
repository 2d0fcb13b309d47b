"""``bench._ranks.gather``, the lab benches' wait for their rank processes (shared by
``ina bench fabric`` and ``ina bench lab-allreduce``): rank 0's last JSON line, a
one-line error naming every failed rank, and a bound in time."""

import subprocess
import sys
import time

import pytest

from ina_fabric.bench._ranks import gather


def _rank(code):
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_gather_returns_rank_0s_last_json_line():
    procs = [_rank("print('noise'); print('{\"t\": 1.5}')"), _rank("print('{}')")]
    assert gather(procs, 30, ["h0", "h1"]) == {"t": 1.5}


def test_gather_names_each_failed_rank_and_kills_past_the_timeout():
    procs = [_rank("print('{}')"), _rank("import sys; sys.stderr.write('boom'); sys.exit(3)")]
    with pytest.raises(RuntimeError, match=r"ranks failed: \[\('h1', 3, 'boom'\)\]"):
        gather(procs, 30, ["h0", "h1"])
    slow = [_rank("import time; time.sleep(60)")]
    t = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        gather(slow, 1, ["h0"])
    assert time.monotonic() - t < 30 and slow[0].poll() is not None
