"""Benchmark scenarios: one module per scenario, found by `bench.run` automatically.

A scenario is a module `bench/scenarios/<something>.py` (names starting with
`_` are skipped) that defines:

    NAME: str          unique, what `--scenario NAME` selects
    DESCRIPTION: str   one line for the results and `--list`
    ORDER: int         optional, run order (default 100; catalog reads are 10)

    def run(ctx: bench.context.BenchContext) -> dict

`run` loads the shop through `ctx.load(label=..., concurrency=..., requests=[...]
or factory=..., expected=(...), on_response=...)`, which prints and returns
one run's figures, and returns a JSON-ready dict whose `runs` list holds those
figures (they are plotted and turned into ratios); any other keys (e.g.
invariants checked after the load: "orders == charges") are stored as they
are. Use `ctx.concurrency_levels()` so `--quick` runs one level only,
`ctx.skus` for the seeded catalog and `ctx.tokens(n)` / `ctx.auth_headers(t)`
for authenticated requests. An exception fails that scenario only: the
others still run, the error is recorded and `make bench` exits non-zero.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    order: int
    module: ModuleType

    def run(self, ctx) -> dict:
        return self.module.run(ctx)


def discover() -> list[Scenario]:
    """Import every scenario module of this package and return them in run order."""
    found: dict[str, Scenario] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        name = getattr(module, "NAME", None)
        if not isinstance(name, str) or not callable(getattr(module, "run", None)):
            raise TypeError(f"{module.__name__} must define NAME (str) and run(ctx) -> dict")
        if name in found:
            raise ValueError(f"two scenarios are named {name!r}")
        found[name] = Scenario(
            name=name,
            description=getattr(module, "DESCRIPTION", ""),
            order=getattr(module, "ORDER", 100),
            module=module,
        )
    return sorted(found.values(), key=lambda s: (s.order, s.name))
