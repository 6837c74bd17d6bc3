"""Throttles for logging in: per username and per client address."""

from rest_framework.throttling import SimpleRateThrottle

from core.db import database_now_estimate, note_clock_offset


class DatabaseClockThrottle(SimpleRateThrottle):
    """DRF's rate throttle with its timestamps by the database clock.

    The throttle keeps each bucket's recent attempts as timestamps in the
    shared cache and forgets those older than the period. By each host's own
    clock (DRF's `time.time`), a host 5 minutes ahead forgets every other
    host's attempts at once and its own linger 5 minutes on the others: the
    budget would depend on which host a balancer picks. The database clock
    is the one every host shares; this process reads its offset from it once
    (`core.db.note_clock_offset`, a query on the first throttled request;
    while the database does not answer, this host's clock).
    """

    def timer(self) -> float:
        note_clock_offset()
        return database_now_estimate().timestamp()


class TokenUsernameThrottle(DatabaseClockThrottle):
    """Limit token requests for one username, whichever address they come from."""

    scope = "auth_token"

    def get_cache_key(self, request, view):
        username = ""
        if isinstance(request.data, dict):
            username = str(request.data.get("username", ""))[:150].lower()
        return self.cache_format % {"scope": self.scope, "ident": f"user:{username}"}


class TokenAddressThrottle(DatabaseClockThrottle):
    """Limit token requests from one address, whichever usernames they try."""

    scope = "auth_token"

    def get_rate(self):
        # An address may try a few usernames; five times the per-user rate.
        rate = super().get_rate()
        assert rate is not None  # the settings give auth_token a rate
        num, period = rate.split("/")
        return f"{int(num) * 5}/{period}"

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": "auth_token_addr", "ident": self.get_ident(request)}


class RegisterThrottle(DatabaseClockThrottle):
    scope = "register"

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class _LoginAttempt:
    """What the token throttles read of a request, for a log-in form post."""

    def __init__(self, request, username: str):
        self.data = {"username": username}
        self.META = request.META
        self.headers = request.headers


def login_wait(request, *, username: str) -> float | None:
    """Count one log-in attempt of the storefront's form in the token endpoint's buckets.

    The same cache keys as `TokenUsernameThrottle` and `TokenAddressThrottle`,
    so the form and `POST /api/v1/auth/token/` share one budget per username
    and per address. Returns None when allowed, else the seconds to wait.
    """
    attempt = _LoginAttempt(request, username)
    waits = [
        throttle.wait() or 1.0
        for throttle in (TokenUsernameThrottle(), TokenAddressThrottle())
        # Duck-typed: the throttles read only what _LoginAttempt has; no view.
        if not throttle.allow_request(attempt, None)  # type: ignore[arg-type]
    ]
    return max(waits) if waits else None
