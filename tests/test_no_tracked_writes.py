"""No command writes into tracked files by default (issue 42): ``ina bench wan`` drew its
PNGs into docs/ unless told otherwise, over the record kept there."""

import ast
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_bench_wan_plots_beside_its_results_by_default():
    from ina_fabric.bench.bench_wan import _parser, plot_folder
    from ina_fabric.paths import BENCH_RESULTS_DIR
    a = _parser().parse_args([])
    assert a.plot is None
    folder = plot_folder(a.plot, BENCH_RESULTS_DIR / "wan.json")
    assert folder == BENCH_RESULTS_DIR
    assert plot_folder("", BENCH_RESULTS_DIR / "wan.json") is None
    assert plot_folder("elsewhere", BENCH_RESULTS_DIR / "wan.json") == pathlib.Path("elsewhere")


def test_the_default_output_folders_are_git_ignored():
    """Every default output folder (``ina_fabric.paths``) is ignored by git here."""
    from ina_fabric import paths
    for d in (paths.BUILD_DIR, paths.OUT_DIR, paths.BENCH_RESULTS_DIR):
        probe = str(d / "probe.json")
        r = subprocess.run(["git", "check-ignore", "-q", probe], cwd=ROOT)
        assert r.returncode == 0, f"{probe} is not git-ignored"


def test_no_flag_defaults_into_a_tracked_folder():
    """No output flag's default (``--out``, ``--plot``, ``--*-dir``, ...) in the commands
    or the benches points into a folder git tracks (docs/, host/, hw/, ...)."""
    tracked_tops = {p.split("/")[0] for p in subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
        if "/" in p}
    bad = []
    for path in list((ROOT / "host").rglob("*.py")) + list((ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                flags = [a.value for a in node.args if isinstance(a, ast.Constant)]
                where = any(w in f for f in flags for w in ("out", "plot", "dir", "path"))
                for kw in node.keywords:
                    if kw.arg == "default" and where and isinstance(kw.value, ast.Constant) \
                            and isinstance(kw.value.value, str):
                        top = kw.value.value.strip("./").split("/")[0]
                        if top in tracked_tops:
                            bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: "
                                       f"default={kw.value.value!r}")
    assert not bad, "\n".join(bad)
