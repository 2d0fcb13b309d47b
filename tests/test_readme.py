"""The README is a short tour for users (issue 42): at most 320 lines, every `ina ...`
command it shows exists (runs with --help), and every link it gives lands on a file
(and a heading) that exists."""

import contextlib
import io
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _commands(text: str) -> list:
    """The verb paths of every ``ina ...`` command in code blocks and inline code."""
    spans = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    spans += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    paths = set()
    for span in spans:
        for line in span.splitlines():
            for m in re.finditer(r"(?:^|[\s;(])(?:sudo\s+)?(?:\.venv/bin/)?ina\s+(.*)", line):
                words = []
                for w in m.group(1).split():
                    end = w.endswith(";")
                    w = w.rstrip(";")
                    if not re.fullmatch(r"[a-z][\w-]*", w):
                        break
                    words.append(w)
                    if end:
                        break
                if words:
                    paths.add(tuple(words))
    return sorted(paths)


def test_the_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= 320, f"README.md has {n} lines (at most 320)"


def test_the_readme_shows_commands_and_they_all_exist():
    from ina_fabric.host.cli import main
    paths = _commands(README.read_text())
    assert len(paths) >= 15 and ("top",) in paths and ("env",) in paths
    bad = []
    for path in paths:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            try:
                code = main(list(path) + ["--help"])
            except SystemExit as e:
                code = e.code
        if code not in (0, None) or "usage:" not in out.getvalue():
            bad.append("ina " + " ".join(path))
    assert not bad, f"commands shown in the README that do not run with --help: {bad}"


def test_a_missing_command_would_be_caught():
    from ina_fabric.host.cli import main
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit) as e:
        main(["no-such-verb", "--help"])
    assert e.value.code == 2


def _slug(heading: str) -> str:
    h = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"\s", "-", h)


def test_every_link_lands():
    text = README.read_text()
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "#")):
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path
        if not file.exists():
            bad.append(target)
        elif anchor:
            heads = {_slug(h) for h in re.findall(r"^#+\s+(.*)$", file.read_text(), re.M)}
            if anchor not in heads:
                bad.append(target)
    assert not bad, f"README links that land nowhere: {bad}"


def test_no_issue_numbers_or_run_logs_in_the_readme():
    text = README.read_text()
    assert not re.search(r"\bissue \d+|\brun \d+\b|\bruns \d+", text, re.I)


def test_design_semantics_and_settings_are_one_click_away():
    """A newcomer finds the design, the aggregator's semantics and every setting from the
    README: each is linked from it directly (the settings page lists every INA_* name)."""
    links = set(re.findall(r"\]\(([^)\s]+)\)", README.read_text()))
    for target in ("docs/design.md", "docs/design.md#aggregator-semantics",
                   "docs/settings.md"):
        assert target in links, target
    from ina_fabric.settings import SETTINGS
    page = (ROOT / "docs" / "settings.md").read_text()
    assert all(s.name in page for s in SETTINGS)
