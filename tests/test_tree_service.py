"""A tree of `ina switch` processes on loopback (docs/fabric.md): each switch with its own
control key, `ina switch --parent` on the leaves, one `ina switch --install-tree` that
installs every entry, `--status --tree` naming the rack and the worker a job waits for,
and real worker processes (``SwitchClient``) whose every rank gets the same bytes, within
the quantization bound of the float64 sum.

The 64-worker run (4 racks of 16 worker processes) is the issue's scale check; it takes
about 10 s here. INA_TREE_WORKERS sets another size (racks of 16; e.g. 1024 workers is
32 racks of 32 with INA_TREE_RACK=32, for a manual run)."""

import json
import multiprocessing as mp
import os
import secrets
import subprocess
import sys
import time

import numpy as np
import pytest

from ina_fabric.host.switch import query_status
from ina_fabric.host.switch.tree import load_tree_toml
from ina_fabric.host.cluster import worker_data
# imported once here, not in each forked worker (64 imports on two cores: a slow start)
from ina_fabric.host.transport import SwitchClient

INA = [sys.executable, "-m", "ina_fabric.host.cli"]


class TreeOfSwitches:
    """A spine and ``racks`` leaves, each `ina switch` with its own key file; workers'
    addresses (free ports on 127.0.0.1) in a tree TOML."""

    def __init__(self, tmp_path, ports, racks, per_rack, engine="auto"):
        # one block of ports below the kernel's ephemeral range, all free at once: ports
        # taken one call at a time from the ephemeral range could repeat a switch's
        # (released until the switch starts) or be any process's ephemeral port by the
        # time a worker binds, minutes later at 64 workers on a loaded machine
        from conftest import consecutive_free_ports
        base = consecutive_free_ports(racks + 1 + racks * per_rack)
        sw = list(range(base, base + racks + 1))
        self.spine = ("127.0.0.1", sw[0])
        self.leaves = [("127.0.0.1", p) for p in sw[1:]]
        first = base + racks + 1
        self.workers = [[("127.0.0.1", first + r * per_rack + k) for k in range(per_rack)]
                        for r in range(racks)]
        self.keys = {}
        self.procs = []
        lines = [f'spine = "127.0.0.1:{sw[0]}"']
        for i, addr in enumerate([self.spine] + self.leaves):
            path = tmp_path / f"switch{i}.key"
            path.write_text(secrets.token_hex(32) + "\n")
            path.chmod(0o600)
            self.keys[addr] = str(path)
        lines.append(f'spine_key_file = "{self.keys[self.spine]}"')
        for i, leaf in enumerate(self.leaves):
            ws = ", ".join(f'"{a}:{p}"' for a, p in self.workers[i])
            lines += ["[[leaf]]", f'switch = "{leaf[0]}:{leaf[1]}"', f"workers = [{ws}]",
                      f'key_file = "{self.keys[leaf]}"']
        self.toml = tmp_path / "tree.toml"
        self.toml.write_text("\n".join(lines) + "\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("INA_SWITCH_KEY")}
        self.env = env
        for addr in [self.spine] + self.leaves:
            cmd = INA + ["switch", "--listen", f"{addr[0]}:{addr[1]}", "--key-file",
                         self.keys[addr], "--engine", engine]
            if addr != self.spine:
                cmd += ["--parent", f"{self.spine[0]}:{self.spine[1]}"]
            self.procs.append(subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                                               env=env))
        from ina_fabric.protocol.keys import switch_key
        for addr in [self.spine] + self.leaves:
            key = switch_key(path=self.keys[addr])
            for _ in range(200):
                try:
                    query_status(addr, timeout=0.1, key=key)
                    break
                except OSError:
                    time.sleep(0.05)
            else:
                raise AssertionError(f"switch {addr} did not start")

    def install(self, job, *flags):
        r = subprocess.run(INA + ["switch", "--install-tree", str(self.toml), "--job",
                                  str(job), *flags], capture_output=True, text=True,
                           env=self.env, timeout=60)
        return r

    def status(self, job):
        r = subprocess.run(INA + ["switch", "--status", "--tree", str(self.toml), "--job",
                                  str(job)], capture_output=True, text=True, env=self.env,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def close(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def tree_of(tmp_path, ports):
    made = []

    def make(racks, per_rack, **kw):
        t = TreeOfSwitches(tmp_path, ports, racks, per_rack, **kw)
        made.append(t)
        return t
    yield make
    for t in made:
        t.close()


def _worker(role, job, session, n, elements, seed, calls, out, go, ready, mode="reliable",
            deadline=0.005, late=0.0, start_delay=0.0, connect_timeout=60.0):
    """One worker process: its client at its leaf, ``calls`` allreduces of its data
    (``late``: seconds it sleeps before each call, a compute straggler; ``start_delay``:
    seconds it takes to start, a slow start). It says it is ``ready`` once its client is
    bound, and sends nothing before ``go``."""
    ip, port = role["addr"].split(":")
    sip, sport = role["switch"].split(":")
    told = False
    try:
        time.sleep(start_delay)
        c = SwitchClient((sip, int(sport)), job, role["worker"], role["nworkers"],
                         window=8, elements=elements, bind=(ip, int(port)), session=session,
                         stall_timeout=60.0, connect_timeout=connect_timeout, mode=mode,
                         deadline=deadline)
        ready.release()
        told = True
        go.wait(READY_S)
        for it in range(calls):
            time.sleep(late)
            k = role["rank"]
            y, _ = c.allreduce(worker_data(seed, k, it, n))
            np.save(os.path.join(out, f"r{k}_{it}.npy"), y)
        c.close()
    except Exception as e:       # the parent sees the missing file and this message
        with open(os.path.join(out, f"r{role['rank']}.err"), "w") as fh:
            fh.write(f"{type(e).__name__}: {e}")
    finally:
        if not told:
            ready.release()


#: how long the workers of one run_workers may take to start, in all
READY_S = 300.0


def run_workers(roles, job, session, n, elements, out, calls=2, seed=7, skip=(), late=(),
                slow_start=(), **kw):
    """Start a process per role (not those in ``skip``), and let them send once every
    one has its client: a worker's connect timeout then runs from a common start. (It ran
    from each worker's own start, while the others were still forking and starting: 64
    workers on two loaded cores took over a minute, and the first ones gave up with
    SwitchUnavailable after their 60 s.) ``slow_start``: ranks that take 8 s to start."""
    ctx = mp.get_context("fork")
    go, ready = ctx.Event(), ctx.Semaphore(0)
    procs = []
    for r in roles:
        if r["rank"] in skip:
            continue
        p = ctx.Process(target=_worker, args=(r, job, session, n, elements, seed, calls,
                                              str(out), go, ready),
                        kwargs=dict(kw, late=1.0 if r["rank"] in late else 0.0,
                                    start_delay=8.0 if r["rank"] in slow_start else 0.0),
                        daemon=True)
        p.start()
        procs.append(p)
    end = time.monotonic() + READY_S
    for _ in procs:
        if not ready.acquire(timeout=max(0.0, end - time.monotonic())):
            break
    go.set()
    return procs


def join_all(procs, seconds):
    """Wait for every process, ``seconds`` in all (not each); end those still running."""
    end = time.monotonic() + seconds
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(5)


def check_results(roles, out, n, elements, calls, seed=7):
    """Every rank's result is bitwise the same, within the quantization bound of the
    float64 sum (the bound LocalCluster's workers check)."""
    from ina_fabric.host.transport import quantize as Q
    N = len(roles)
    errs = {p.stem: p.read_text() for p in sorted(out.glob("*.err"))}
    missing = [r["rank"] for r in roles for it in range(calls)
               if f"r{r['rank']}" not in errs and not (out / f"r{r['rank']}_{it}.npy").exists()]
    assert not errs and not missing, (f"ranks that raised: {errs}; ranks with neither a "
                                      f"result nor an error (died or hung): {missing}")
    for it in range(calls):
        ys = [np.load(out / f"r{r['rank']}_{it}.npy") for r in roles]
        for y in ys[1:]:
            assert y.tobytes() == ys[0].tobytes()
        xs = np.array([worker_data(seed, k, it, n) for k in range(N)])
        exact = xs.astype(np.float64).sum(axis=0)
        chunks = Q.local_exponents(np.abs(xs).max(axis=0), elements)
        bound = np.repeat([Q.error_bound(int(e), N) for e in chunks], elements)[:n] + \
            np.abs(exact) * 2.0 ** -23
        assert (np.abs(ys[0].astype(np.float64) - exact) <= bound).all()


def roles_of(install_stdout):
    doc = json.loads(install_stdout)
    roles = doc["workers"]
    for k, r in enumerate(roles):
        r["rank"] = k
    return roles, int(doc["session"], 16)


def test_install_tree_then_a_stall_names_the_rack_and_the_worker(tree_of, tmp_path):
    t = tree_of(2, 2)
    r = t.install(38, "--elements", "64")
    assert r.returncode == 0, r.stderr
    roles, session = roles_of(r.stdout)
    assert [(x["worker"], x["nworkers"], x["rack"]) for x in roles] == \
        [(0, 4, 0), (1, 4, 0), (0, 4, 1), (1, 4, 1)]
    out = tmp_path / "out"
    out.mkdir()
    # worker 1 of rack 1 does not come: the job stalls at rack 1's leaf
    procs = run_workers(roles, 38, session, 100, 64, out, calls=1, skip={3})
    time.sleep(1.0)
    st = t.status(38)
    assert st["spine"]["waiting_for_racks"] == [{"rack": 1, "switch": "%s:%d" % t.leaves[1]}]
    assert st["spine"]["total_workers"] == 4 and st["spine"]["members_are"] == "switches"
    assert st["racks"][0]["waiting_for_workers"] == []
    assert st["racks"][0]["awaiting_parent"] > 0
    assert st["racks"][1]["waiting_for_workers"] == [{"worker": 1,
                                                      "addr": "%s:%d" % t.workers[1][1]}]
    procs += run_workers(roles[3:], 38, session, 100, 64, out, calls=1)
    for p in procs:
        p.join(60)
    check_results(roles, out, 100, 64, calls=1)


def test_install_tree_refuses_in_one_line(tree_of, tmp_path):
    t = tree_of(1, 1)
    r = t.install(5, "--mode", "bounded", "--deadline-ms", "5", "--spine-deadline-ms", "5")
    assert r.returncode == 2 and "spine deadline 5 ms must be longer" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    # a leaf whose key the installer does not have refuses the whole tree
    bad = tmp_path / "bad.toml"
    bad.write_text(t.toml.read_text().replace(t.keys[t.leaves[0]], str(tmp_path / "x.key")))
    (tmp_path / "x.key").write_text(secrets.token_hex(32) + "\n")
    r = t.install(5, "--elements", "16")
    assert r.returncode == 0
    r = subprocess.run(INA + ["switch", "--install-tree", str(bad), "--job", "6"],
                       capture_output=True, text=True, env=t.env, timeout=60)
    assert r.returncode == 2 and "127.0.0.1:%d" % t.leaves[0][1] in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_leaf_refuses_an_entry_for_another_parent(tree_of, tmp_path):
    t = tree_of(1, 1)
    from ina_fabric.host.switch.tree import tree_jobs
    from ina_fabric.host.switch import send_job, JobRefused
    from ina_fabric.protocol.jobtable import JobSettings
    from ina_fabric.protocol.keys import switch_key
    import dataclasses
    cfg = tree_jobs(load_tree_toml(t.toml), 9, JobSettings())[t.leaves[0]]
    cfg = dataclasses.replace(cfg, parent=("127.0.0.1", 1))
    with pytest.raises(JobRefused, match="this switch's parent is"):
        send_job(t.leaves[0], cfg, key=switch_key(path=t.keys[t.leaves[0]]))


#: the scale tier: 64 worker processes (4 racks of 16) or INA_TREE_WORKERS in racks of
#: INA_TREE_RACK; about 100 s on this shared 2-core machine under load, so behind
#: INA_TREE_SCALE=1 (the default suite runs 2 racks of 4)
WORKERS = int(os.environ.get("INA_TREE_WORKERS", "64"))
RACK = int(os.environ.get("INA_TREE_RACK", "16"))
SCALE = pytest.param(max(1, WORKERS // RACK), RACK, id=f"{WORKERS}-workers", marks=[
    pytest.mark.skipif(not os.environ.get("INA_TREE_SCALE"),
                       reason="scale tier: INA_TREE_SCALE=1")])


@pytest.mark.parametrize("racks,per_rack", [pytest.param(2, 4, id="8-workers"), SCALE])
def test_worker_processes_on_a_two_level_tree_agree_bitwise(tree_of, tmp_path, racks,
                                                             per_rack):
    t = tree_of(racks, per_rack)
    r = t.install(64, "--elements", "256")
    assert r.returncode == 0, r.stderr
    roles, session = roles_of(r.stdout)
    assert len(roles) == racks * per_rack
    out = tmp_path / "out"
    out.mkdir()
    n, calls = 1000, 2
    t0 = time.monotonic()
    procs = run_workers(roles, 64, session, n, 256, out, calls=calls)
    join_all(procs, 600)
    print(f"{len(roles)} workers, {racks} racks: {calls} calls in "
          f"{time.monotonic() - t0:.1f} s (processes started included)")
    from ina_fabric.protocol.keys import switch_key
    try:
        check_results(roles, out, n, 256, calls)
    except AssertionError as e:      # say where the tree stood (every switch's STATUS)
        where = {f"{a}:{p}": query_status((a, p), key=switch_key(path=t.keys[(a, p)]),
                                          timeout=5.0)
                 for a, p in [t.spine] + t.leaves}
        raise AssertionError(f"{e}\n{json.dumps(where, indent=1, sort_keys=True)}") from None
    spine = query_status(t.spine, key=switch_key(path=t.keys[t.spine]))["counters"]
    # one DATA per rack and packet reached the spine, one RESULT per packet left it
    assert spine["results"] > 0
    assert spine["accepted"] == racks * spine["results"]
    assert spine["partials"] == 0
    for leaf in t.leaves:
        c = query_status(leaf, key=switch_key(path=t.keys[leaf]))["counters"]
        assert c["up"] == c["relayed"] == spine["results"]


def test_a_slow_starting_worker_does_not_time_out_the_others(tree_of, tmp_path):
    """The workers send once all of them have their clients: one that takes 8 s to start
    does not make the others' 2 s connect timeout run out (it did, as SwitchUnavailable,
    when a worker's clock started at its own start: the 64-worker tier's failure)."""
    t = tree_of(2, 2)
    r = t.install(41, "--elements", "64")
    assert r.returncode == 0, r.stderr
    roles, session = roles_of(r.stdout)
    out = tmp_path / "out"
    out.mkdir()
    procs = run_workers(roles, 41, session, 100, 64, out, calls=1, slow_start={3},
                        connect_timeout=2.0)
    join_all(procs, 120)
    check_results(roles, out, 100, 64, calls=1)


def test_bounded_straggler_every_rank_gets_the_same_bytes(tree_of, tmp_path):
    """Bounded mode on the tree: a worker a second late at every call; its leaf closes
    without it at the leaf's deadline, the spine has every rack's sum and closes, and
    every rank (the straggler too, answered by its leaf from the stored result) applies
    the same bytes: a rescaled sum of the workers the RESULT counted."""
    t = tree_of(2, 2)
    r = t.install(40, "--elements", "64", "--mode", "bounded", "--deadline-ms", "50")
    assert r.returncode == 0, r.stderr
    roles, session = roles_of(r.stdout)
    out = tmp_path / "out"
    out.mkdir()
    procs = run_workers(roles, 40, session, 200, 64, out, calls=2, late={3},
                        mode="bounded", deadline=0.05)
    for p in procs:
        p.join(120)
    assert not [p.read_text() for p in out.glob("*.err")]
    for it in range(2):
        ys = [np.load(out / f"r{k}_{it}.npy") for k in range(4)]
        assert all(y.tobytes() == ys[0].tobytes() for y in ys)
        # each chunk is the sum of the workers some RESULT counted, rescaled by N / count
        # (which ones, on a loaded machine, the deadlines decide)
        import itertools
        xs = np.array([worker_data(7, k, it, 200) for k in range(4)], np.float64)
        for c in range(0, 200, 64):
            y = ys[0][c:c + 64].astype(np.float64)
            fits = [S for m in range(1, 5) for S in itertools.combinations(range(4), m)
                    if np.allclose(y, xs[list(S), c:c + 64].sum(axis=0) * 4 / len(S),
                                   rtol=1e-3, atol=1e-2)]
            assert fits, (it, c)
    from ina_fabric.protocol.keys import switch_key
    leaf1 = query_status(t.leaves[1], key=switch_key(path=t.keys[t.leaves[1]]))["counters"]
    spine = query_status(t.spine, key=switch_key(path=t.keys[t.spine]))["counters"]
    assert leaf1["partials"] > 0 and leaf1["resent"] > 0      # the straggler, answered
    assert spine["partials"] == spine["results"] > 0          # every RESULT lacks one
