"""The docs describe today's code: no stale promises (docs/testing.md, "Checked docs").

A doc or docstring that says something is "not built yet", comes in a
"later issue" or "arrives with" one goes stale the day it is built; the
present tense is checked instead, here.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STALE = re.compile(r"not built yet|later issue|arrives with", re.IGNORECASE)


def _tracked(*patterns: str) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_no_doc_or_docstring_promises_something_for_later():
    files = [p for p in _tracked("*.md", "*.py") if not p.startswith("tests/")]
    found = [
        f"{path}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate((ROOT / path).read_text().splitlines(), 1)
        if STALE.search(line)
    ]
    assert found == []


# --- names the docs give: each must still exist ------------------------------------

PACKAGES = (
    "config",
    "backoffice",
    "core",
    "idempotency",
    "inventory",
    "orders",
    "payments",
    "reports",
    "shop",
)
_TEST_REF = re.compile(r"`((?:[\w/]+\.py)?::\w+(?:\[[^\]]*\])?)`")
_DOTTED = re.compile(r"`((?:" + "|".join(PACKAGES) + r")(?:\.\w+)+)`")


def _test_names(path: Path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }


def _proved_by_refs(text: str) -> list[tuple[str, str]]:
    """(`tests/` file, test) for every `file::test` and `::test` (the file before it)."""
    refs: list[tuple[str, str]] = []
    for line in text.splitlines():
        current = None
        for ref in _TEST_REF.findall(line):
            path, _, name = ref.partition("::")
            current = path or current
            if current is not None:
                refs.append((current, name.split("[")[0]))
    return refs


def _resolves(dotted: str) -> bool:
    import importlib

    from config.celery import app

    app.loader.import_default_modules()  # every app's tasks module, as a worker does
    if dotted in app.tasks:  # a Celery task's name
        return True
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                target = getattr(target, attr)
        except AttributeError:
            return False
        return True
    return False


# --- the names themselves -----------------------------------------------------------

_APPS = "|".join(PACKAGES)
# A database object's name (`payments_refund_key_uniq`, `idempotency_key_open_idx`):
# an app's prefix; checked when its last word is one PostgreSQL names end in here.
_DB_NAME = re.compile(r"`((?:" + _APPS + r")_[a-z0-9_]+)`(?!\{)")
# A setting (`OUTBOX_CONSUMER_BATCH`, `PAYMENTS_SETTLE_*`, `IDEMPOTENCY_COMPLETER_BATCH|BUDGET`).
_UPPER = re.compile(r"`([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+(?:_\*|(?:\|[A-Z0-9]+)+)?)`")
_FILE = re.compile(r"`([\w/]+\.py)`")


_CHAOS = "\n## Under combined faults"
_INVARIANT = re.compile(r"`([a-z][a-z0-9_]+)`")


def _missing_invariants(text: str) -> list[str]:
    """The chaos table names the invariants of tools/chaos/invariants.py."""
    defined = set(
        re.findall(r'Invariant\("(\w+)"', (ROOT / "tools/chaos/invariants.py").read_text())
    )
    table = text.split(_CHAOS, 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ")[-1] for line in table.splitlines() if line.startswith("| ")][2:]
    return [
        f"{name} (no such chaos invariant)"
        for name in sorted({name for row in rows for name in _INVARIANT.findall(row)})
        if name not in defined
    ]


def _checked_text(name: str) -> str:
    """The doc's text that names today's code ("Renames" in the glossary keeps old names)."""
    return (ROOT / "docs" / name).read_text().split("\n## Renames")[0]


def _python_names() -> set[str]:
    """Every function and class defined in production code (not migrations)."""
    import ast

    names: set[str] = set()
    for path in _tracked("*.py"):
        if path.startswith("tests/") or "/migrations/" in path:
            continue
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
    return names


def _database_names() -> set[str]:
    """Constraint and index names of the migrated test database."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint"
            " WHERE connamespace = 'public'::regnamespace"
            " UNION SELECT indexname FROM pg_indexes WHERE schemaname = 'public'"
        )
        return {row[0] for row in cursor.fetchall()}


def _setting_prefixes() -> set[str]:
    """First words of the project's settings (config/settings/*.py): `IDEMPOTENCY`, `OUTBOX`..."""
    import ast

    prefixes: set[str] = set()
    for path in _tracked("config/settings/*.py"):
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                if isinstance(target, ast.Name) and target.id.isupper() and "_" in target.id:
                    prefixes.add(target.id.split("_")[0])
    return prefixes


def _missing_files_and_functions(text: str) -> list[str]:
    missing = []
    for path, name in _proved_by_refs(text):
        # A test is named from tests/; a row may also name the production code that
        # decides it (`orders/services.py::order_hold`), from the repository's top.
        file = ROOT / "tests" / path
        if not file.exists() and (ROOT / path).exists():
            file = ROOT / path
        if not file.exists():
            missing.append(f"{path} (no such file)")
        elif name not in _test_names(file):
            missing.append(f"{path}::{name}")
    for path in _FILE.findall(text):
        if not any((base / path).exists() for base in (ROOT, ROOT / "tests", ROOT / "docs")):
            missing.append(f"{path} (no such file)")
    return missing


def _missing_constraints(text: str, database: set[str], python: set[str]) -> list[str]:
    endings = {name.rsplit("_", 1)[-1] for name in database}
    return [
        f"{name} (no such constraint or index)"
        for name in sorted(set(_DB_NAME.findall(text)))
        if name.rsplit("_", 1)[-1] in endings and name not in python and name not in database
    ]


def _missing_settings(text: str, prefixes: set[str]) -> list[str]:
    from django.conf import settings

    known = {name for name in dir(settings) if name.isupper()}
    missing = []
    for written in sorted(set(_UPPER.findall(text))):
        if written.split("_")[0] not in prefixes:
            continue  # a constant (`INBOX_CONSTRAINT`, `PAYMENT_UNKNOWN`), not a setting
        if written.endswith("_*"):
            if not any(name.startswith(written[:-1]) for name in known):
                missing.append(f"{written} (no such setting)")
            continue
        first, *others = written.split("|")
        base = first.rsplit("_", 1)[0]
        for name in [first, *(f"{base}_{other}" for other in others)]:
            if name not in known:
                missing.append(f"{name} (no such setting)")
    return missing


def test_every_name_the_guarantees_and_the_glossary_give_exists(db):
    """Files, functions, tests, constraints, settings and dotted names: all reported at once."""
    guarantees, glossary = _checked_text("guarantees.md"), _checked_text("glossary.md")
    assert len(_proved_by_refs(guarantees)) > 50  # the parser reads the tables
    dotted = sorted(set(_DOTTED.findall(glossary)))
    assert len(dotted) > 30
    database, python, prefixes = _database_names(), _python_names(), _setting_prefixes()
    assert len(database) > 50  # the test database is migrated
    missing = [f"guarantees.md: {name}" for name in _missing_invariants(guarantees)]
    # The chaos table's names are invariants, checked above, not database objects.
    guarantees = guarantees.split(_CHAOS)[0] + "\n".join(
        line for line in guarantees.split(_CHAOS)[1].splitlines() if not line.startswith("| ")
    )
    for doc, text in (("guarantees.md", guarantees), ("glossary.md", glossary)):
        found = [
            *_missing_files_and_functions(text),
            *_missing_constraints(text, database, python),
            *_missing_settings(text, prefixes),
        ]
        missing += [f"{doc}: {name}" for name in found]
    missing += [f"glossary.md: {name} (does not resolve)" for name in dotted if not _resolves(name)]
    missing = list(dict.fromkeys(missing))  # each once, in the docs' order
    assert not missing, f"{len(missing)} names in the docs no longer exist:\n" + "\n".join(missing)


def test_the_checks_see_the_names_the_docs_give(db):
    """The patterns find what they must check (a pattern that matches nothing checks nothing)."""
    guarantees, glossary = _checked_text("guarantees.md"), _checked_text("glossary.md")
    database = _database_names()
    both = guarantees + glossary
    constraints = {n for n in _DB_NAME.findall(both) if n in database}
    assert {
        "idempotency_idempotencykey_owner_key_uniq",
        "payments_payment_refunded_le_reserved_le_captured",
        "idempotency_key_open_idx",
    } <= constraints
    assert {"COMPENSATION_MAX_ATTEMPTS", "IDEMPOTENCY_LEASE_TTL", "PAYMENTS_SETTLE_*"} <= set(
        _UPPER.findall(both)
    )
    assert "idempotency/keys/claim.py" in {path for path, _ in _proved_by_refs(guarantees)}
    # A wrong name of each kind is reported.
    wrong = (
        "`idempotency/keys/run.py::_no_such_insert` `payments_refund_no_such_uniq` "
        "`IDEMPOTENCY_NO_SUCH_TTL` `PAYMENTS_SWEEP_INTERVAL|NOSUCH` `no/such/file.py`"
    )
    found = [
        *_missing_files_and_functions(wrong),
        *_missing_constraints(wrong, database, _python_names()),
        *_missing_settings(wrong, _setting_prefixes()),
    ]
    assert found == [
        "idempotency/keys/run.py::_no_such_insert",
        "no/such/file.py (no such file)",
        "payments_refund_no_such_uniq (no such constraint or index)",
        "IDEMPOTENCY_NO_SUCH_TTL (no such setting)",
        "PAYMENTS_SWEEP_NOSUCH (no such setting)",
    ]


# --- code keeps the rule, docs keep the story (docs/contributing.md) ------------------

# Production code: the apps, the run command and the two files at the top.
PRODUCTION = (*PACKAGES, "runner", "manage.py", "gunicorn.conf.py")
# Code that does not ship keeps the rule too: the tests, the bench, the tools, CI's scripts.
TOOLING = ("tests", "bench", "tools", ".ci")
# The header Django writes on a migration it makes; not a story.
_DJANGO_HEADER = re.compile(r"# Generated by Django [\d.]+ on 20\d\d-\d\d-\d\d \d\d:\d\d")
_RUN = r"\bruns?\b"
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?"
_FEW = r"(?:two|three|four|five|six|seven|eight|nine|ten|several|many|dozens of)"
RUN_STORY = {
    "a date": re.compile(
        r"(?<![\d-])(?:20\d\d-\d\d-\d\d\b|\d\d-\d\d[ T]\d\d:\d\d\b|20\d{6}T\d{4,6}Z)"
        rf"|\b{_MONTH} \d{{1,2}}(?:st|nd|rd|th)?,? 20\d\d\b|\b\d{{1,2}} {_MONTH} 20\d\d\b"
    ),
    "a run count": re.compile(
        rf"\b\d+ (?:of|out of) (?:the )?\d+ (?:[\w'-]+ ){{0,3}}?{_RUN}"
        rf"|\b(?:\d+|{_FEW}) (?:[\w'-]+ )?(?:chaos|bench|soak|load|long|short|CI) runs\b"
        rf"|\b(?:\d+|{_FEW}) runs? (?:of|on|with) (?:the|this|that) (?:code|branch|commit)\b"
    ),
    "a run's commit": re.compile(r"\b(?:commit|code at|run at) [0-9a-f]{7,40}\b"),
    "a run's clock time": re.compile(
        rf"{_RUN}[^.;()]{{0,30}}?\b\d{{1,2}}:\d\d\b|\b\d{{1,2}}:\d\d\b[^.;()]{{0,30}}?{_RUN}"
    ),
    "a run by its length": re.compile(
        rf"\b\d+-(?:second|minute|hour)\b[\w\s'-]{{0,30}}?{_RUN}|\b\d+ ?(?:s|min|h)\s+run\b"
    ),
    "a named run": re.compile(
        r"\b(?:chaos|soak|bench|load) run (?:of|at|on)\b|\brun (?:of|at|on) \d"
    ),
    "a run's finding": re.compile(
        r"\b(?:found|seen|shown|caught) (?:by|in|while watching) (?:the|a|its|one)\b"
        rf"[\w\s'-]{{0,30}}?{_RUN}"
    ),
    "what runs found": re.compile(
        r"\b(?:the|its|our|those|these) (?:first|last|earlier|previous|later|long|short|latest)"
        r" (?:[\w-]+ )?runs? (?:lost|had|saw|found|showed|ended|failed|passed|scored|held)\b"
    ),
    "a run's measurement": re.compile(
        r"\brun's (?:[\w-]+ ){0,2}\d+(?:\.\d+)? ?(?:s|ms|min|h|MB|GB|%)(?!\w)"
    ),
    "what a run saw": re.compile(
        r"\brun's\b[^.;:()]{0,60}?\b(?:saw|found|held|ended|scored|refused|showed|was|were|had)\b"
    ),
}
# A measured count (a thousands separator, a percentage) in a sentence about a run; one
# after a comparison (`>= 2,000`, "more than 10 %") is a target or a threshold: a rule.
_FIGURE = re.compile(r"\b\d{1,3}(?:,\d{3})+\b|\b\d+(?:\.\d+)? ?%")
_BOUND = re.compile(
    r"(?:[<>]=?|[≤≥]|\b(?:more|fewer|less) than|\bat (?:least|most)|\bup to|\btarget)\s*$"
)


def run_stories(text: str) -> list[str]:
    """What in `text` (one comment block or docstring) narrates a run: "<kind>: <match>"."""
    flat = " ".join(text.split())
    found = [f"{kind}: {m.group(0)}" for kind, rx in RUN_STORY.items() for m in rx.finditer(flat)]
    for sentence in re.split(r"(?<=[.;])\s", flat):
        if not re.search(r"\brun\b", sentence):
            continue
        measured = [
            f for f in _FIGURE.finditer(sentence) if not _BOUND.search(sentence[: f.start()])
        ]
        if measured:
            found.append(f"a run's figures: {measured[0].group(0)} in {sentence!r}")
    return found


def _prose(source: str) -> list[tuple[int, str]]:
    """(first line, text) of every comment block and docstring of a module's source."""
    import ast
    import io
    import tokenize

    comments: list[tuple[int, str]] = []  # consecutive comment lines make one block
    last = -1
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT or _DJANGO_HEADER.fullmatch(token.string):
            continue
        line, text = token.start[0], token.string.lstrip("#").strip()
        if comments and line == last + 1:
            comments[-1] = (comments[-1][0], f"{comments[-1][1]}\n{text}")
        else:
            comments.append((line, text))
        last = line
    blocks = comments
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                blocks.append((node.body[0].lineno, doc))
    return blocks


def _run_stories_in(path: str, source: str) -> list[str]:
    return [
        f"{path}:{line}: {story}" for line, text in _prose(source) for story in run_stories(text)
    ]


@pytest.mark.parametrize("tops", [PRODUCTION, TOOLING], ids=["production", "tests-and-tools"])
def test_production_comments_and_docstrings_tell_no_run_stories(tops):
    """Dates, run times, run counts and run figures live in docs/runs/ and commit bodies.

    Production code, the tests, the bench and the tools alike: a comment or a docstring
    says the rule in the present tense and links the doc section that tells the story.
    """
    files = [p for p in _tracked("*.py") if p.split("/")[0] in tops]
    assert len(files) > 50
    found = [story for path in files for story in _run_stories_in(path, (ROOT / path).read_text())]
    assert found == []


def test_the_run_story_check_flags_a_story_and_passes_a_rule():
    """The check is not empty: each kind of story is flagged, the rules beside them are not."""
    stories = {
        "in the 30-minute RabbitMQ chaos run of 2026-12-03 09:22": "a date",
        "as the 12-03 06:18 run showed": "a date",
        "In the 10:17 run both of host b's workers exited": "a run's clock time",
        "the run at 06:18 was quiet": "a run's clock time",
        "297 in one 180 s run, still unacked": "a run by its length",
        "the long chaos run of last night": "a named run",
        "found by the chaos run's partitions": "a run's finding",
        "the chaos run's supervisor_kill found two such orphans": "what a run saw",
        "the chaos run's CI form saw no 503 within 2 s": "what a run saw",
        "the Redis run's broker ended with 20,133 messages": "a run's figures",
        "39 % of the compensation tasks in that run were looks": "a run's figures",
        "3 of 5 runs failed on the heal": "a run count",
        "the short runs had 4-8 of 108-163 over": "what runs found",
        "as three chaos runs showed": "a run count",
        "the first runs lost PostgreSQL 0.6 s after its crash recovery": "what runs found",
        "The long RabbitMQ run's 22.6 s checkout": "a run's measurement",
        "seen on December 3, 2026 at night": "a date",
        "its plot is 20261203T061847Z-redis-2h-1800s.png": "a date",
        "the code at 1ad9d84 held": "a run's commit",
    }
    for text, kind in stories.items():
        assert [s for s in run_stories(text) if s.startswith(kind)], text
    rules = [
        "The chaos run judges hung requests by it (tools/chaos/faults.py).",
        "Stored in UTC: PostgreSQL refuses offsets past 15:59 that RFC 3339 allows.",
        "Hot tables vacuum after ~1-2 % of their rows changed, not the defaults' 20 % / 10 %.",
        "Every sweep (5 s) rings what is due; the next run goes on.",
        "A lost ring is rung again once its lease runs out.",
        "Sessions are found by their `user_id` column.",
        "Who fired it, for the chaos run's judge: an exit is a kill of that host's server.",
        "0001-01-01T00:00+01:00 is before year 1 in UTC",
        # as the code now says what the runs showed (core/due.py, config/settings/servers.py)
        "so the other hosts' workers would hold the rings of a host ahead by as much as it is"
        ' ahead (docs/failure-model.md, "What broke, and what fixed it").',
        "without it such a session holds its rows (loyalty rows every later delivery waits on)"
        " with no bound in time",
        "when pgbench moved more than 10 % between them, every figure of the run is noisy.",
        "Targets: >= 1,000 deliveries/s and >= 10 x the checkout orders/s of the same run.",
        "Each of the 3 phases runs once; a retry runs 2 of 3 steps again.",
        "The day closes at midnight UTC; May 2026 prices stay.",
    ]
    assert [s for rule in rules for s in run_stories(rule)] == []
    # A file: a dated comment and a run's figures in a docstring are flagged, Django's header
    # is not.
    source = (
        "# Generated by Django 5.2.19 on 2026-12-03 14:47\n"
        '"""The sweep.\n\nThe chaos run ended with 6,745 messages in the broker."""\n'
        "x = 1  # a fix of 2026-12-02\n"
    )
    assert [s.split(": ")[0:2] for s in _run_stories_in("m.py", source)] == [
        ["m.py:5", "a date"],
        ["m.py:2", "a run's figures"],
    ]


# --- links and section citations: a moved section takes its readers along -----------

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# `docs/payments.md, "Refunds"`, `docs/events.md "Shopper e-mails"`, `[x.md](x.md), "lease"`.
_CITE = re.compile(r'\b((?:docs/)?[\w/-]+\.md)(?:\]\([^)\s]*\))?,? \(?"([^"]{2,90})"')


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _broken_links(path: str, text: str) -> list[str]:
    """Relative links of one markdown file whose file or `#heading` does not exist."""
    broken = []
    for target in _LINK.findall(re.sub(r"```.*?```", "", text, flags=re.S)):
        if re.match(r"[a-z]+:", target):
            continue  # http:, mailto:
        file, _, anchor = target.partition("#")
        dest = (ROOT / path).parent / file if file else ROOT / path
        if not dest.exists():
            broken.append(f"{path}: {target} (no such file)")
        elif anchor and dest.suffix == ".md":
            headings = [line.lstrip("#") for line in dest.read_text().splitlines()]
            if anchor not in {_slug(h) for h in headings if h}:
                broken.append(f"{path}: {target} (no such heading)")
    return broken


def _titles(doc: Path) -> list[str]:
    """A doc's headings and bold lead-ins (`**Bounded waits.**`), flattened, lower case."""
    text = doc.read_text()
    headings = [re.sub(r"^#+\s*", "", line) for line in text.splitlines() if line.startswith("#")]
    bold = re.findall(r"(?:^|\n)\s*(?:- |\d+\. )?\*\*([^*]+)\*\*", text)
    return [" ".join(title.split()).lower() for title in headings + bold]


def _broken_citations(path: str, text: str) -> list[str]:
    """`<doc>.md, "<section>"` in `text` (from `path`) whose doc has no such section."""
    broken = []
    for doc, section in _CITE.findall(" ".join(text.replace("#", " ").split())):
        base = (ROOT / path).parent if path.endswith(".md") else ROOT / "docs"
        dest = ROOT / doc if doc.startswith("docs/") else base / doc
        if dest.suffix != ".md" or not dest.exists():
            continue
        wanted = " ".join(section.split()).lower()
        if not any(title.startswith(wanted) or wanted in title for title in _titles(dest)):
            broken.append(f'{path}: {doc}, "{section}" (no such section)')
    return broken


def test_every_relative_link_and_section_citation_resolves():
    """Links in the markdown, and `docs/x.md, "Section"` in it and in code's prose, land."""
    broken = []
    for path in _tracked("*.md"):
        text = (ROOT / path).read_text()
        broken += _broken_links(path, text) + _broken_citations(path, text)
    for path in _tracked("*.py"):
        if "docs/" in (source := (ROOT / path).read_text()) or '.md"' in source:
            broken += [
                cite
                for _, prose in _prose(source)
                for cite in _broken_citations(path, prose.replace("\n", " "))
            ]
    assert broken == []


def test_the_link_checks_find_a_moved_section():
    text = (
        "[due](due-work.md) [gone](no-such.md) [anchor](glossary.md#lease)"
        ' [bad anchor](glossary.md#renames) [glossary.md](glossary.md), "Renames"\n'
        'docs/runs/bench.md, "Statements of one keyed checkout" and'
        ' docs/performance.md, "Statements of one keyed checkout"'
    )
    assert _broken_links("docs/x.md", text) + _broken_citations("docs/x.md", text) == [
        "docs/x.md: no-such.md (no such file)",
        "docs/x.md: glossary.md#renames (no such heading)",
        'docs/x.md: glossary.md, "Renames" (no such section)',
        'docs/x.md: docs/performance.md, "Statements of one keyed checkout" (no such section)',
    ]
