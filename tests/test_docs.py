"""The user documents (README.md and docs/*.md; not the record in docs/results/) say what
holds now: no issue numbers and no run-by-run history, which live in docs/results/ with
their commands. Every relative link in the docs, the record included, lands on a file and
a heading that exist."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
USER_DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
ALL_DOCS = USER_DOCS + sorted((ROOT / "docs" / "results").glob("*.md"))

# "issue 42", "issue #42", "issues 38-39", "Issue 44's": a project issue by number. A link
# to another project's tracker (".../issues/135712") has no space, so it passes.
_ISSUE = re.compile(r"\bissues?\s*#?\d+", re.I)
# "the issue's target", "this issue": the project's tracker named as the reader's context.
_THE_ISSUE = re.compile(r"\b(?:the|this) issue(?:'s)?\b(?!\s+(?:of|with|that|is|was))", re.I)
# "run 4", "runs 33-34", "Run 39's", "run #2": a run by number. "runs 4 ranks" (the verb,
# a count of things) is allowed: a number followed by a counted noun.
_COUNTED = (r"ranks?|workers?|hosts?|processes|process|times|steps?|seeds?|reps?|"
            r"repetitions?|jobs?|rounds?|epochs?|switches|threads?|calls?|tests?|"
            r"flows?|copies|ms|s|minutes?|seconds?|cores?|namespaces?|iterations?")
_RUN = re.compile(r"\bruns?\s*#?\d+(?:\s*[-–,]\s*\d+)*+(?!\d)(?!\s+(?:%s)\b)" % _COUNTED, re.I)


def _offences(text: str) -> list:
    text = re.sub(r"https?://\S+", "", text)
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for rx in (_ISSUE, _THE_ISSUE, _RUN):
            out += [f"{n}: {m.group(0)!r}" for m in rx.finditer(line)]
    return out


def test_user_docs_name_no_issue_and_no_run():
    bad = {}
    for doc in USER_DOCS:
        found = _offences(doc.read_text())
        if found:
            bad[str(doc.relative_to(ROOT))] = found
    assert not bad, ("issue numbers or runs by number in user documents (move the figures "
                     f"to docs/results/ and say what holds now): {bad}")


def test_the_rule_catches_what_it_should_and_lets_counts_pass():
    caught = ["as in issue 42", "Issue #38's gateware", "in run 39 of", "Run 2 left",
              "runs 33-34, now", "the default since run 35)", "(run 3).", "the issue's 1.3x",
              "run 8 against run 9"]
    passed = ["It runs 4 ranks with a 4 MB", "the tests run 2-4 workers with", "it runs 3 times",
              "(torch [#1](https://github.com/pytorch/pytorch/issues/135712))",
              "## Limits and known issues", "reruns 5 of them", "a run of 10 steps"]
    assert all(_offences(s) for s in caught), [s for s in caught if not _offences(s)]
    assert not any(_offences(s) for s in passed), [s for s in passed if _offences(s)]


def _slug(heading: str) -> str:
    h = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"\s", "-", h)


def test_every_relative_link_in_the_docs_lands():
    bad = []
    for doc in ALL_DOCS:
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                bad.append(f"{doc.relative_to(ROOT)}: {target}")
            elif anchor and file.suffix == ".md":
                heads = {_slug(h) for h in re.findall(r"^#+\s+(.*)$", file.read_text(), re.M)}
                if anchor not in heads:
                    bad.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not bad, f"links that land nowhere: {bad}"
