"""Issue 43, the command line: a missing extra is named before any work, nothing plots
unless asked (results are written first), and a failure is one line."""

import os
import subprocess
import sys
import time

import pytest

BLOCKER = '''
import sys
BLOCKED = set(filter(None, __import__("os").environ.get("INA_TEST_BLOCK", "").split(",")))
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Block())
'''


def _ina(tmp_path, block, *argv, timeout=300):
    """``ina ARGV`` in a subprocess where the modules ``block`` cannot be imported (as
    in an install without their extra)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               INA_TEST_BLOCK=",".join(block))
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "ina_fabric.host.cli", *argv],
                         capture_output=True, text=True, timeout=timeout, env=env,
                         cwd=tmp_path)
    return out, time.monotonic() - t0


def test_missing_plot_extra_is_named_before_any_work(tmp_path):
    """Before: `ina schedule optimize` plotted unasked and crashed after computing
    (ModuleNotFoundError: matplotlib); `ina train --plot` crashed after training and
    lost results.json."""
    out, _ = _ina(tmp_path, ["matplotlib"], "schedule", "optimize", "--plot",
                  "--time-budget", "1", "--out", str(tmp_path / "o"))
    assert out.returncode == 2 and not (tmp_path / "o" / "schedule.json").exists()
    assert out.stderr.strip().splitlines() == [
        "ina schedule: error: --plot needs the plot extra (matplotlib is not "
        "installed): pip install 'ina-fabric[plot]'"]
    out, secs = _ina(tmp_path, ["matplotlib"], "train", "--plot", "--max-epochs", "1",
                     "--out", str(tmp_path / "t"))
    assert out.returncode == 2 and "pip install 'ina-fabric[plot]'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and secs < 30   # before training


def test_nothing_plots_unless_asked(tmp_path):
    out, _ = _ina(tmp_path, ["matplotlib"], "schedule", "optimize", "--time-budget", "1",
                  "--memory", "1e8", "--update-bytes", "1e9", "--out", str(tmp_path / "o"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "o" / "schedule.json").exists()
    assert not (tmp_path / "o" / "schedule.png").exists()


def test_core_only_install_names_the_torch_extra(tmp_path):
    """Before: a core-only install crashed `ina train` with a ModuleNotFoundError
    traceback."""
    out, secs = _ina(tmp_path, ["torch", "sklearn"], "train", "--max-epochs", "1")
    assert out.returncode == 2 and secs < 30
    assert out.stderr.strip().splitlines() == [
        "ina train: error: needs the torch extra (torch is not installed): "
        "pip install 'ina-fabric[torch]'"]


def test_backend_without_a_switch_under_torchrun_is_one_line_per_rank(tmp_path):
    """Before: the one-line reason sat inside about 100 lines, two ranks' tracebacks
    interleaved (3 tracebacks: both ranks' and torchrun's own); now each rank prints one
    line, and only torchrun's own report (its ChildFailedError) follows."""
    script = tmp_path / "noswitch.py"
    script.write_text("import torch.distributed as dist\n"
                      "import ina_fabric.distributed  # noqa: F401\n"
                      "dist.init_process_group('ina')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("INA_")}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", str(script)], capture_output=True,
                         text=True, timeout=300, env=env, cwd=tmp_path)
    text = out.stdout + out.stderr
    mine = [ln for ln in text.splitlines() if ln.startswith("rank ")]
    assert out.returncode != 0 and len(mine) == 2, text
    for r, ln in enumerate(sorted(mine)):
        assert ln == (f"rank {r}: ValueError: no switch address: set INA_SWITCH=ip:port or "
                      f"pass switch= (INA_DEBUG=1 shows the traceback)")
    assert text.count("Traceback (most recent call last)") <= 1    # torchrun's own
    assert "ina_fabric" not in text and "/host/" not in text


def test_ctrl_c_on_ina_allreduce_is_quiet(tmp_path):
    """Before: Ctrl-C on `ina allreduce` printed KeyboardInterrupt tracebacks (of the
    forked workers). The run starts with SIGINT at its default, as a terminal's
    foreground job does: a test runner started in the background (a shell's ``&``) ignores
    SIGINT, its children inherit that, and ``ina`` then rightly ignores Ctrl-C (below)."""
    import signal
    p = subprocess.Popen([sys.executable, "-m", "ina_fabric.host.cli", "allreduce",
                          "--workers", "2", "--size", "16M", "--iterations", "200"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, cwd=tmp_path,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(8)                 # imports, the switch, the workers: mid-run by now
    os.killpg(p.pid, signal.SIGINT)   # as a terminal's Ctrl-C: the whole group
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_a_switch_started_with_sigint_ignored_keeps_ignoring_it(tmp_path, ports):
    """Before: ``ina switch`` caught SIGINT whatever its disposition at start. Started
    in the background (SIGINT ignored, as a shell's ``&`` does), ``ina allreduce``
    ignored a group's Ctrl-C while its forked switch caught it and stopped under the
    workers, which waited out their 30 s stall timeout and failed (exit 2). Now a
    switch keeps an ignored SIGINT ignored, and SIGTERM still stops it."""
    import signal
    from ina_fabric.host.switch import query_status
    from conftest import consecutive_free_ports
    sport, = ports(1)
    sw = _switch_proc(tmp_path, sport, consecutive_free_ports(2),
                      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        sw.send_signal(signal.SIGINT)
        time.sleep(1.0)
        assert sw.poll() is None, "the switch stopped on an ignored SIGINT"
        query_status(("127.0.0.1", sport), timeout=2.0)      # still answering
        sw.send_signal(signal.SIGTERM)
        assert sw.wait(timeout=10) == 0
    finally:
        sw.kill()


def _switch_proc(tmp_path, sport, base, *extra, preexec_fn=None):
    """`ina switch --local-workers 2` in a child, answering STATUS; killed by caller."""
    from ina_fabric.host.switch import query_status
    p = subprocess.Popen([sys.executable, "-m", "ina_fabric.host.cli", "switch", "--listen",
                          f"127.0.0.1:{sport}", "--local-workers", "2", "--base-port",
                          str(base), "--session", "0x43", *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
                         preexec_fn=preexec_fn)
    for _ in range(300):
        try:
            query_status(("127.0.0.1", sport), timeout=0.1)
            return p
        except OSError:
            time.sleep(0.1)
    p.kill()
    raise RuntimeError("ina switch did not start")


def _allreduce(tmp_path, sport, base, *extra):
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "ina_fabric.host.cli", "allreduce",
                          "--switch", f"127.0.0.1:{sport}", "--workers", "2",
                          "--base-port", str(base), "--session", "0x43", "--size", "64K",
                          *extra], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    return out, time.monotonic() - t0


def test_allreduce_cli_mismatches_are_named(tmp_path, ports):
    """`ina allreduce --switch` against `ina switch --local-workers 2` (256 elements):
    with its own default element count (16,368), a wrong job id, and run twice. Before:
    a 30 s stall ending in "65 of 81 packets outstanding"; "give its session id" for a
    job that does not exist; the second run "no answer from switch" (its DATA stale)."""
    from conftest import consecutive_free_ports
    sport, = ports(1)
    base = consecutive_free_ports(2)
    sw = _switch_proc(tmp_path, sport, base)
    try:
        out, secs = _allreduce(tmp_path, sport, base)           # 16,368 elements
        assert out.returncode == 2 and secs < 30, out.stderr
        err = out.stderr.strip().splitlines()
        assert len(err) == 1 and "takes 256 elements" in err[0] and "sent 16368" in err[0]
        out, secs = _allreduce(tmp_path, sport, base, "--job", "7", "--elements", "256")
        assert out.returncode == 2 and "has no job 7" in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
        out = subprocess.run([sys.executable, "-m", "ina_fabric.host.cli", "allreduce",
                              "--switch", f"127.0.0.1:{sport}", "--job", "7"],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert out.returncode == 2 and "has no job 7 (it holds: 1)" in out.stderr, out.stderr
        for run in range(2):                                    # a static job, twice
            out, _ = _allreduce(tmp_path, sport, base, "--elements", "256")
            assert out.returncode == 0, (run, out.stderr)
            assert '"refetched": 0' in out.stdout and "must be <= 1" in out.stdout
    finally:
        sw.terminate()
        sw.wait(10)
