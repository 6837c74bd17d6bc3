"""The mutation check: each deliberately wrong change must make its guarding tests fail.

`make mutants` (and a stage of .ci/run) runs this. For each mutant below, in
turn: copy the checkout (tracked and untracked-but-not-ignored files, as they
are in the working tree) to a temporary folder, apply the mutant's edits
there as exact text replacements (each `old` text must occur exactly once, or
the check fails loudly: a mutant list that no longer matches the code is an
error, never a silent pass), and run only the tests that guard that
guarantee, in the order listed, stopping at the first failure (`--all`
runs them all, to see every test that kills it). A mutant is *killed* when
at least one of those tests fails; it *survived* when they all pass. The
developer's tree is never modified.

Before the mutants, the same tests run once on an unmutated copy and must
all pass (a kill means nothing if the test failed anyway). A pytest run that
does not get as far as running tests (a collection or import error, exit
status other than 0/1) is an error of the tool, not a kill.

Usage:
    python tools/mutants.py                 # baseline + every mutant
    python tools/mutants.py 5-loyalty-version 6-fencing   # only these
    python tools/mutants.py --list          # the mutants and their tests
    python tools/mutants.py --no-baseline 3a-hold-single  # iterate on one
    python tools/mutants.py --keep 4-inbox  # keep the mutated copy, print its path

The runs use the environment's DATABASE_URL / REDIS_URL, except that the
database name gets a `_mutants` suffix, so pytest-django's test database
(`test_<name>_mutants`) never collides with a `make test` of the same
checkout. Exit status: 0 when every mutant was killed, 1 when one survived,
2 on an error (text not found, baseline failing, pytest not running tests).

See docs/testing.md, "Mutation check".
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Edit:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    name: str
    breaks: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]


RUN = "idempotency/keys/run.py"
CLAIM = "idempotency/keys/claim.py"
RACES = "tests/idempotency/test_races.py"
KEYS = "tests/idempotency/test_keys.py"

_KEY_UNIQUE_MODEL = """            models.UniqueConstraint(
                fields=["owner", "key"], name="idempotency_idempotencykey_owner_key_uniq"
            ),
"""
_KEY_UNIQUE_MIGRATION = """                    models.UniqueConstraint(
                        fields=("owner", "key"), name="idempotency_idempotencykey_owner_key_uniq"
                    ),
"""
_ON_CONFLICT = (
    '            f"  ON CONFLICT ON CONSTRAINT {OWNER_KEY_CONSTRAINT} DO NOTHING RETURNING id)"\n'
)
_PLAIN_RETURNING = '            "  RETURNING id)"\n'

_CHECK_THEN_ACT = """        table = connection.ops.quote_name(IdempotencyKey._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT 1 FROM {table} WHERE owner_id = %s AND key = %s",
                [self.owner_id, self.key],
            )
            if cursor.fetchone() is not None:
                raise KeyClaimLost(f"{run!r}: another request holds this key")
        failpoint("idempotency.claim.before_insert")
"""

_INBOX_INSERT = (
    "    try:\n        with transaction.atomic():\n"
    "            InboxMessage.objects.create(consumer=consumer, message_id=message_id)\n"
)

MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="1-key-unique",
        breaks="no (owner, key) unique constraint (model + migration), the claim a plain "
        "INSERT: two requests that both saw no key both insert and both run",
        edits=(
            Edit("idempotency/models.py", _KEY_UNIQUE_MODEL, ""),
            Edit("idempotency/migrations/0001_initial.py", _KEY_UNIQUE_MIGRATION, ""),
            Edit(CLAIM, _ON_CONFLICT, _PLAIN_RETURNING),
        ),
        tests=(
            f"{KEYS}::test_losing_insert_rolls_back_before_any_effect",
            f"{RACES}::test_simultaneous_inserts_one_claim_wins",
            f"{RACES}::test_twenty_concurrent_identical_requests_make_one_effect",
        ),
    ),
    Mutant(
        name="2-claim-check-then-act",
        breaks="the claim looks the key up, then INSERTs if absent (no ON CONFLICT): two "
        "requests that both saw no key race; the loser fails on the constraint "
        "instead of being answered 409 / replay",
        edits=(
            Edit(CLAIM, '        failpoint("idempotency.claim.before_insert")\n', _CHECK_THEN_ACT),
            Edit(CLAIM, _ON_CONFLICT, _PLAIN_RETURNING),
        ),
        tests=(
            f"{RACES}::test_simultaneous_inserts_one_claim_wins",
            f"{RACES}::test_twenty_concurrent_identical_requests_make_one_effect",
            f"{KEYS}::test_losing_insert_rolls_back_before_any_effect",
        ),
    ),
    Mutant(
        name="3a-hold-single",
        breaks="one stock row: UPDATE reserved + q without `on_hand >= reserved + q` "
        "(the row count then always says granted): oversells",
        edits=(
            Edit(
                "inventory/services.py",
                '"  updated_at = statement_timestamp() WHERE id = %s AND on_hand >= reserved + %s"',
                '"  updated_at = statement_timestamp() WHERE id = %s AND %s > 0"',
            ),
        ),
        tests=(
            "tests/inventory/test_services.py::TestHold",
            "tests/inventory/test_services.py::test_many_concurrent_reservers_never_oversell",
        ),
    ),
    Mutant(
        name="3b-hold-several",
        breaks="several stock rows, all-or-nothing: the UPDATE without "
        "`on_hand - reserved >= q`: oversells",
        edits=(
            Edit(
                "inventory/services.py",
                'grant, guard = "r.q", "s.on_hand - s.reserved >= r.q"',
                'grant, guard = "r.q", "true"',
            ),
        ),
        tests=("tests/inventory/test_services.py::TestHold",),
    ),
    Mutant(
        name="4-inbox-no-insert",
        breaks="inbox_claim returns True without inserting: every duplicate message "
        "applies its effect again",
        edits=(
            Edit(
                "idempotency/messaging/inbox.py",
                _INBOX_INSERT,
                "    return True\n" + _INBOX_INSERT,
            ),
        ),
        tests=("tests/idempotency/test_inbox.py",),
    ),
    Mutant(
        name="5-loyalty-version",
        breaks="the loyalty UPDATE without `AND version = %s`: two applies that read the "
        "same version both write (the same event applied twice)",
        edits=(
            Edit(
                "shop/loyalty.py",
                '"WHERE user_id = %(user_id)s AND version = %(version)s "',
                '"WHERE user_id = %(user_id)s "',
            ),
        ),
        tests=(
            "tests/shop/test_loyalty.py::test_the_same_event_from_two_threads_at_once_applies_once",
            "tests/shop/test_loyalty.py::test_concurrent_events_for_one_account_lose_no_update",
        ),
    ),
    Mutant(
        name="6-fencing",
        breaks="_fenced_update without `leased_by = <my token>`: a run whose lock was taken "
        "over still commits its phase (two runs' effects)",
        edits=(
            Edit(
                RUN,
                """        f" WHERE {col('id')} = %s AND {col('leased_by')} = %s"\n""",
                """        f" WHERE {col('id')} = %s AND (%s::text IS NOT NULL OR TRUE)"\n""",
            ),
        ),
        tests=(f"{KEYS}::test_phase_of_a_run_taken_over_cannot_commit",),
    ),
    Mutant(
        name="7-refund-key-counter",
        breaks="the refund's provider key from a counter (the payment's refunds + 1), not "
        "the refund id: a retry or a concurrent refund gets another key",
        edits=(
            Edit(
                "payments/refunds.py",
                "    key = refund_provider_key(refund_id=refund_id, install=install)\n",
                "    key = provider_key(\n"
                "        install=install,\n"
                '        reference=f"refund-{payment_id}-'
                '{Refund.objects.filter(payment_id=payment_id).count() + 1}",\n'
                '        kind="refund",\n'
                "    )\n",
            ),
        ),
        tests=(
            "tests/payments/test_refunds.py::test_same_refund_id_five_times_is_one_refund",
            "tests/payments/test_refunds.py::"
            "test_concurrent_refunds_never_exceed_captured_and_the_wrong_twin_does",
        ),
    ),
)


class MutantError(Exception):
    """The check could not be run as written: an error of the tool or the tree, not a result."""


def _tracked_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    return sorted({name for name in out.decode().split("\0") if name})


def _copy_tree(dest: Path) -> None:
    """Copy the checkout's files as they are in the working tree (deleted ones skipped)."""
    for name in _tracked_files():
        src = ROOT / name
        if not src.is_file() or src.is_symlink():
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def _apply(tree: Path, mutant: Mutant) -> None:
    for edit in mutant.edits:
        path = tree / edit.path
        if not path.is_file():
            raise MutantError(f"{mutant.name}: {edit.path} does not exist")
        text = path.read_text()
        found = text.count(edit.old)
        if found != 1:
            raise MutantError(
                f"{mutant.name}: the text to replace occurs {found} times in {edit.path} "
                f"(must be exactly once; the code moved: update the mutant):\n{edit.old}"
            )
        path.write_text(text.replace(edit.old, edit.new))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    url = env.get("DATABASE_URL")
    if url:
        parts = urlsplit(url)
        name = parts.path.lstrip("/") or "postgres"
        env["DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{name}_mutants"))
    env.pop("PYTEST_ADDOPTS", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@dataclass
class Outcome:
    name: str
    status: str  # killed, SURVIVED, passed (baseline), ERROR
    failed: list[str]
    seconds: float
    detail: str = ""


def _node_name(classname: str, name: str) -> str:
    """`tests.shop.test_loyalty` + `test_x` → `test_loyalty.py::test_x` (classes kept)."""
    parts = classname.split(".")
    modules = [i for i, part in enumerate(parts) if part.startswith("test_")]
    if not modules:
        return f"{classname}::{name}" if classname else name
    i = modules[-1]
    return "::".join([f"{parts[i]}.py", *parts[i + 1 :], name])


def _failed_tests(report: Path) -> tuple[list[str], int]:
    if not report.exists():
        return [], 0
    root = ET.parse(report).getroot()
    failed, ran = [], 0
    for case in root.iter("testcase"):
        ran += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(_node_name(case.get("classname", ""), case.get("name", "?")))
    return failed, ran


def _run_tests(
    tree: Path, tests: tuple[str, ...], label: str, verbose: bool, first: bool
) -> Outcome:
    report = tree / ".mutants-report.xml"
    report.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--timeout=120",
        f"--junitxml={report}",
        "-o",
        "junit_family=xunit1",
        *(["-x"] if first else []),
        *tests,
    ]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=tree, env=_env(), capture_output=True, text=True)
    seconds = time.monotonic() - started
    failed, ran = _failed_tests(report)
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
    if verbose:
        print(proc.stdout + proc.stderr)
    if proc.returncode not in (0, 1) or ran == 0:
        return Outcome(label, "ERROR", failed, seconds, f"pytest exit {proc.returncode}:\n{tail}")
    if proc.returncode == 1 and not failed:
        return Outcome(label, "ERROR", failed, seconds, f"pytest exit 1, no failed test:\n{tail}")
    status = "failed" if failed else "passed"
    return Outcome(label, status, failed, seconds, tail if failed else "")


def _check_one(mutant: Mutant, work: Path, keep: bool, verbose: bool, first: bool) -> Outcome:
    tree = Path(tempfile.mkdtemp(prefix=f"{mutant.name}-", dir=work))
    try:
        _copy_tree(tree)
        _apply(tree, mutant)
        outcome = _run_tests(tree, mutant.tests, mutant.name, verbose, first)
        if outcome.status == "failed":
            outcome.status = "killed"
        elif outcome.status == "passed":
            outcome.status = "SURVIVED"
        return outcome
    finally:
        if keep:
            print(f"kept the mutated copy of {mutant.name}: {tree}")
        else:
            shutil.rmtree(tree, ignore_errors=True)


def _baseline(mutants: list[Mutant], work: Path, verbose: bool) -> Outcome:
    tests: list[str] = []
    for mutant in mutants:
        tests += [t for t in mutant.tests if t not in tests]
    tree = Path(tempfile.mkdtemp(prefix="baseline-", dir=work))
    try:
        _copy_tree(tree)
        return _run_tests(tree, tuple(tests), "(baseline: no mutation)", verbose, first=False)
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def _table(outcomes: list[Outcome]) -> str:
    width = max(len(o.name) for o in outcomes)
    lines = [f"{'mutant':<{width}}  {'result':<8}  {'time':>6}  failing tests", "-" * (width + 60)]
    for o in outcomes:
        names = ", ".join(o.failed) or "-"
        lines.append(f"{o.name:<{width}}  {o.status:<8}  {o.seconds:5.1f}s  {names}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    parser.add_argument(
        "--all",
        action="store_true",
        help="run every guarding test of a mutant (default: stop at the first failure)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the mutated copies")
    parser.add_argument("-v", "--verbose", action="store_true", help="print pytest's output")
    args = parser.parse_args(argv)

    by_name = {m.name: m for m in MUTANTS}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        parser.error(f"unknown mutants {unknown}; known: {', '.join(by_name)}")
    chosen = [by_name[n] for n in args.names] if args.names else list(MUTANTS)
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.breaks}")
            for t in m.tests:
                print(f"    {t}")
        return 0

    started = time.monotonic()
    outcomes: list[Outcome] = []
    work = Path(tempfile.mkdtemp(prefix="mutants-"))
    try:
        # Fail fast on a mutant whose text moved, before any test runs.
        for m in chosen:
            probe = Path(tempfile.mkdtemp(prefix="probe-", dir=work))
            for edit in m.edits:
                target = probe / edit.path
                target.parent.mkdir(parents=True, exist_ok=True)
                if (ROOT / edit.path).is_file():
                    shutil.copy2(ROOT / edit.path, target)
            _apply(probe, m)
            shutil.rmtree(probe)
        if not args.no_baseline:
            base = _baseline(chosen, work, args.verbose)
            print(f"baseline: {base.status} in {base.seconds:.1f}s", flush=True)
            if base.status != "passed":
                print(base.detail, file=sys.stderr)
                raise MutantError("the guarding tests do not pass on the unmutated tree")
        for m in chosen:
            print(f"mutant {m.name} ...", end=" ", flush=True)
            outcome = _check_one(m, work, args.keep, args.verbose, first=not args.all)
            print(f"{outcome.status} ({outcome.seconds:.1f}s)", flush=True)
            if outcome.status == "ERROR":
                print(outcome.detail, file=sys.stderr)
            outcomes.append(outcome)
    except MutantError as exc:
        print(f"\nmutation check ERROR: {exc}", file=sys.stderr)
        return 2
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(_table(outcomes))
    print(f"\n{len(outcomes)} mutants in {time.monotonic() - started:.0f}s")
    if any(o.status == "ERROR" for o in outcomes):
        return 2
    survived = [o.name for o in outcomes if o.status == "SURVIVED"]
    if survived:
        print(f"SURVIVED: {', '.join(survived)}: their guarantee is not tested", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
