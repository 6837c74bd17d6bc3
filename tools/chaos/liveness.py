"""The chaos run's liveness phase: staff end every needs-attention item, then nothing is left.

Nothing happening twice is what the invariants check; this phase checks the
other half of the promise, that every piece of work finishes or hands staff
an action that ends it (issue 20). Once the run is quiet, the run's staff
user logs in to the admin over HTTP and works the "Needs attention" page
(`backoffice/needs_attention.py`) as a person would, in rounds:

1. wait until nothing is pending (`check wait`: due work runs on its own);
2. read the page; nothing listed and quiet → done;
3. take one offered action per item (its keyed form: a lost answer is sent
   again safely), in the order docs/compensation.md ("Which action ends each
   state") gives: settlements, refunds and dead letters first, then failed
   steps, except a step whose reason names a refund still listed, which
   waits a round for that refund's decision (retrying it first would fail
   it again at once).

Per item, staff try the actions in their order of preference, a different
one each round for the same item: pressing "Retry now" on a refund the
provider keeps refusing ends nothing, "Record as failed" does (the step
that owns it then asks again under a new refund id). A refund the provider
refused is recorded as failed first; one whose outcome was unknown is sent
again first (the same provider key: the provider's record decides). An
item left after `ROUNDS` rounds, or one the page offers no action for, is a
dead end and fails the run; `check verify` afterwards checks that nothing is
pending or flagged and that every invariant still holds.

Runs in the driver's process (no Django): HTTP and the page's HTML only.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from urllib.parse import urljoin

import requests

PAGE = "/admin/needs-attention/"
LOGIN = "/admin/login/"
ROUNDS = 8  # rounds of staff actions before what is left is a dead end
ROUND_WAIT = 180  # seconds each round's `check wait` may take
HTTP_TIMEOUT = 60.0
HTTP_TRIES = 4

# Staff's order of preference per kind (the page's action names), and the order kinds
# are worked in within a round (a step's refund is decided before the step is retried).
PREFERENCE = {
    "settlement": ("retry",),
    "refund": ("retry", "failed", "outside", "accept_provider"),
    "dead_letter": ("requeue",),
    "step": ("retry",),
    "report_day": ("retry",),
}
# The provider refused it: sending it again under the same key is refused again.
REFUSED_PREFERENCE = ("failed", "retry", "outside", "accept_provider")
REFUSED_WORDS = ("refused", "declined")
KIND_ORDER = ("settlement", "refund", "dead_letter", "step", "report_day")
SECTION = "needs-attention-"  # the id of each kind's section on the page


@dataclass
class Item:
    """One row of the "Needs attention" page and the action forms it offers."""

    kind: str
    pk: str
    reason: str
    forms: list[dict[str, str]] = field(default_factory=list)

    def describe(self) -> str:
        return f"{self.kind} {self.pk}: {self.reason}"


class _Page(HTMLParser):
    """The parts of an admin page the phase reads: items, their forms, messages, inputs."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.items: list[Item] = []
        self.messages: list[tuple[str, str]] = []  # (level, text)
        self.inputs: dict[str, str] = {}  # every named input outside the items' forms
        self.sections: set[str] = set()  # the kinds the page lists (those the user may view)
        self._item: Item | None = None
        self._form: dict[str, str] | None = None
        self._reason: list[str] | None = None
        self._message: tuple[str, list[str]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if tag == "div" and a.get("id", "").startswith(SECTION):
            self.sections.add(a["id"].removeprefix(SECTION))
        elif tag == "tr" and "attention-item" in classes:
            self._item = Item(kind=a.get("data-kind", ""), pk=a.get("data-pk", ""), reason="")
            self.items.append(self._item)
        elif tag == "td" and self._item is not None and "reason" in classes:
            self._reason = []
        elif tag == "form" and self._item is not None:
            self._form = {}
        elif tag == "input" and a.get("name"):
            target = self._form if self._form is not None else self.inputs
            target[a["name"]] = a.get("value", "")
        elif tag == "li" and self._item is None and classes and classes[0] in (
            "success", "error", "warning", "info"
        ):  # fmt: skip
            self._message = (classes[0], [])

    def handle_endtag(self, tag: str) -> None:
        if tag == "form" and self._form is not None and self._item is not None:
            self._item.forms.append(self._form)
            self._form = None
        elif tag == "td" and self._reason is not None and self._item is not None:
            self._item.reason = " ".join("".join(self._reason).split())
            self._reason = None
        elif tag == "tr":
            self._item = None
        elif tag == "li" and self._message is not None:
            level, text = self._message
            self.messages.append((level, " ".join("".join(text).split())))
            self._message = None

    def handle_data(self, data: str) -> None:
        if self._reason is not None:
            self._reason.append(data)
        if self._message is not None:
            self._message[1].append(data)


def parse(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    page.close()
    return page


class AdminSession:
    """The run's staff user in the admin, over HTTP: log in, read the page, post its forms."""

    def __init__(self, url: str, username: str, password: str) -> None:
        self.url = url.rstrip("/")
        self.username = username
        self.password = password
        self.http = requests.Session()

    def _send(self, method: str, path: str, **kwargs) -> requests.Response:
        """One request, again on no answer or a 5xx (every post here is keyed or a log-in)."""
        for attempt in range(HTTP_TRIES):
            try:
                response = self.http.request(
                    method, urljoin(self.url, path), timeout=HTTP_TIMEOUT, **kwargs
                )
                if response.status_code < 500 or attempt == HTTP_TRIES - 1:
                    return response
            except requests.RequestException:
                if attempt == HTTP_TRIES - 1:
                    raise
            time.sleep(2.0 * (attempt + 1))
        raise AssertionError("unreachable")

    def log_in(self) -> None:
        form = parse(self._send("GET", f"{LOGIN}?next={PAGE}").text).inputs
        answer = self._send(
            "POST",
            LOGIN,
            data={
                "csrfmiddlewaretoken": form.get("csrfmiddlewaretoken", ""),
                "username": self.username,
                "password": self.password,
                "next": PAGE,
            },
            allow_redirects=False,
        )
        if answer.status_code != 302:
            raise RuntimeError(f"admin log-in as {self.username}: {answer.status_code}")

    def _page(self) -> requests.Response:
        response = self._send("GET", PAGE)
        if LOGIN in response.url:  # the session was lost: log in again
            self.log_in()
            response = self._send("GET", PAGE)
        response.raise_for_status()
        return response

    def items(self) -> list[Item]:
        page = parse(self._page().text)
        hidden = set(KIND_ORDER) - page.sections
        if hidden:
            # An empty page is no proof when the user may not see every kind.
            raise RuntimeError(f"{self.username} may not view {', '.join(sorted(hidden))}")
        return page.items

    def take(self, form: dict[str, str]) -> tuple[str, str]:
        """Post one action form; return the page's message (level, text) about it."""
        answer = self._send("POST", PAGE, data=form)
        if answer.status_code == 403:
            return "error", "403: the staff user may not take this action"
        answer.raise_for_status()
        shown = parse(answer.text).messages
        return shown[-1] if shown else ("error", f"{answer.status_code}: no message shown")


@dataclass
class Outcome:
    """What the phase did: actions by kind and result, rounds, what was left."""

    rounds: int = 0
    seen: set[tuple[str, str]] = field(default_factory=set)
    taken: Counter[str] = field(default_factory=Counter)  # "kind action: done|unchanged|error"
    resolved: int = 0  # actions that answered "done."
    left: list[str] = field(default_factory=list)
    quiet: bool = False

    @property
    def ok(self) -> bool:
        return self.quiet and not self.left

    def rows(self) -> list[tuple[str, str, str]]:
        """The run's table rows: (name, checked, violations)."""
        return [
            (
                f"liveness: items resolved {self.resolved}, rounds {self.rounds},"
                f" left {len(self.left)}",
                str(len(self.seen)),
                str(len(self.left)),
            ),
            ("liveness: quiet after resolution", "1", "0" if self.quiet else "1"),
        ]


def _preference(item: Item) -> tuple[str, ...]:
    if item.kind == "refund" and any(w in item.reason.lower() for w in REFUSED_WORDS):
        return REFUSED_PREFERENCE
    return PREFERENCE.get(item.kind, ())


def _choices(item: Item) -> list[dict[str, str]]:
    """The item's forms in staff's order of preference (any other offered one last)."""
    forms = {form.get("action", ""): form for form in item.forms}
    order = [name for name in _preference(item) if name in forms]
    order += sorted(name for name in forms if name not in order)
    return [forms[name] for name in order]


def resolve(
    *,
    url: str,
    username: str,
    password: str,
    wait: Callable[[], int],
    rounds: int = ROUNDS,
    say: Callable[[str], None] = print,
) -> Outcome:
    """Work the "Needs attention" page until it is empty and the system quiet, or `rounds` pass.

    `wait` blocks until nothing is pending (0) or gives up (non-zero).
    """
    outcome = Outcome()
    try:
        _rounds(outcome, AdminSession(url, username, password), wait=wait, rounds=rounds, say=say)
    except (requests.RequestException, RuntimeError) as exc:
        outcome.left.append(f"the phase could not go on: {type(exc).__name__}: {exc}")
    for line in outcome.left:
        say(f"liveness: left: {line}")
    say(
        f"liveness: {outcome.resolved} action(s) done in {outcome.rounds} round(s), "
        f"{len(outcome.left)} item(s) left, {'quiet' if outcome.quiet else 'NOT quiet'}; "
        f"{dict(sorted(outcome.taken.items()))}"
    )
    return outcome


def _rounds(
    outcome: Outcome,
    staff: AdminSession,
    *,
    wait: Callable[[], int],
    rounds: int,
    say: Callable[[str], None],
) -> None:
    staff.log_in()
    tries: Counter[tuple[str, str]] = Counter()
    items: list[Item] = []
    for number in range(rounds + 1):
        outcome.quiet = wait() == 0
        items = staff.items()
        if (not items and outcome.quiet) or number == rounds:
            break
        if not items:
            continue  # nothing for staff, work still pending: wait again
        outcome.rounds += 1
        say(f"liveness round {outcome.rounds}: {len(items)} item(s) need attention")
        listed_refunds = {i.pk for i in items if i.kind == "refund"}
        for item in sorted(items, key=lambda i: KIND_ORDER.index(i.kind)):
            outcome.seen.add((item.kind, item.pk))
            if item.kind == "step" and any(pk in item.reason for pk in listed_refunds):
                continue  # its refund is decided first; retried next round
            choices = _choices(item)
            if not choices:
                continue  # no action offered: left, reported at the end
            form = choices[tries[(item.kind, item.pk)] % len(choices)]
            tries[(item.kind, item.pk)] += 1
            level, text = staff.take(form)
            done = level == "success" and text.endswith("done.")
            outcome.resolved += done
            result = "done" if done else ("unchanged" if level == "success" else "error")
            outcome.taken[f"{item.kind} {form.get('action')}: {result}"] += 1
            if level != "success":
                say(f"liveness: {item.kind} {item.pk} {form.get('action')}: {text}")
    outcome.left = [
        item.describe() + ("" if item.forms else " (no action offered)") for item in items
    ]
