"""What a scenario's `run(ctx)` receives (see bench/scenarios/__init__.py)."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from . import cpu
from .loadgen import Request, Response, run_load
from .server import Gunicorn

_users = itertools.count(1)


@dataclass
class BenchContext:
    """The running shop and the tools to load it.

    Attributes: `base_url` of gunicorn (loopback), `duration` and `warmup` of
    each load run in seconds, `quick` for a smoke run, `skus` of the seeded
    catalog (every product has a million units in stock), `workers` (gunicorn
    sync workers), `log(message)` to print progress.
    """

    base_url: str
    duration: float
    warmup: float
    quick: bool
    skus: list[str]
    workers: int
    server: Gunicorn
    log: Callable[[str], None]
    default_levels: tuple[int, ...] = (1, 4, 16)
    # `--rss-checkouts`: how many checkouts the rss scenario samples across.
    rss_checkouts: int = 10_000
    # `--steady-seconds`: how long each steady phase of the relay scenario writes.
    steady_seconds: float = 300.0
    # `--sustained-rates` and `--sustained-seconds`: the sustained scenario's steps
    # (orders/s, rising) and how long each sends; None: the scenario's defaults.
    sustained_rates: tuple[float, ...] | None = None
    sustained_seconds: float | None = None
    # `--oscar-sustained-rates`: the Oscar peer's steps (bench/scenarios/oscar_sustained.py).
    oscar_sustained_rates: tuple[float, ...] | None = None
    # CPU sources sampled at the edges of every load run besides gunicorn's
    # (bench/cpu.py: name -> cumulative CPU seconds); each run's `cpu_s` holds them.
    cpu_sources: dict[str, Callable[[], float | None]] | None = None

    def concurrency_levels(self, levels: Iterable[int] | None = None) -> tuple[int, ...]:
        """Return the concurrency levels to run: all of them, or the middle one when quick."""
        chosen = tuple(levels) if levels is not None else self.default_levels
        return (chosen[len(chosen) // 2],) if self.quick else chosen

    def load(
        self,
        *,
        label: str,
        concurrency: int,
        requests: Iterable[Request] | None = None,
        factory: Callable[[int, int], Request] | None = None,
        duration: float | None = None,
        max_requests: int | None = None,
        warmup: float | None = None,
        expected: Iterable[int] = (200,),
        on_response: Callable[[Request, Response], None] | None = None,
    ) -> dict:
        """Run the load generator against the shop; print and return the run's figures.

        Arguments are those of `bench.loadgen.run_load`; duration and warm-up
        default to the context's. The returned dict is what goes into the
        scenario's `runs` list (it also carries gunicorn's CPU seconds in the
        measured window, `server_cpu_s`, and with `cpu_sources` each source's
        CPU seconds in the same window, `cpu_s`).
        """
        cpu_before = [0.0]
        sources = self.cpu_sources or {}
        sources_before: dict[str, float | None] = {}

        def measure_start() -> None:
            cpu_before[0] = self.server.cpu_seconds()
            sources_before.update(cpu.read(sources))

        result = run_load(
            self.base_url,
            requests=requests,
            factory=factory,
            concurrency=concurrency,
            duration=self.duration if duration is None and max_requests is None else duration,
            max_requests=max_requests,
            warmup=self.warmup if warmup is None else warmup,
            expected=expected,
            on_response=on_response,
            on_measure_start=measure_start,
            label=label,
        )
        result.extra["server_cpu_s"] = round(self.server.cpu_seconds() - cpu_before[0], 3)
        if sources:
            result.extra["cpu_s"] = cpu.spent(sources_before, cpu.read(sources))
        self.log("  " + result.summary())
        return result.as_dict()

    def tokens(self, count: int, *, staff: bool = False) -> list[str]:
        """Create `count` fresh users (shoppers, or staff) and return their API tokens."""
        from django.contrib.auth import get_user_model

        from shop.services import token_obtain, user_register

        tokens = []
        for _ in range(count):
            username = f"bench-{next(_users)}-{uuid.uuid4().hex[:8]}"
            password = uuid.uuid4().hex + "Aa1!"
            if staff:
                # Staff are made as createsuperuser makes them; never through register.
                user = get_user_model().objects.create_superuser(
                    username=username, email=f"{username}@bench.invalid", password=password
                )
                token = token_obtain(user=user)
            else:
                _, token = user_register(
                    username=username, email=f"{username}@bench.invalid", password=password
                )
            tokens.append(token.key)
        return tokens

    @staticmethod
    def auth_headers(token: str) -> dict[str, str]:
        """Return the header that authenticates a request with `token`."""
        return {"Authorization": f"Token {token}"}


def cpu_ms_per_request(run: dict) -> float | None:
    """Gunicorn CPU milliseconds per request of a `BenchContext.load` run; None if it made none."""
    requests = run.get("requests") or 0
    return round(1000 * run["server_cpu_s"] / requests, 2) if requests else None


def rps_ratio(run: dict, baseline: dict) -> float | None:
    """`run`'s requests per second over `baseline`'s; None if the baseline made none."""
    return round(run["rps"] / baseline["rps"], 3) if baseline["rps"] else None
