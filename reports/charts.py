"""A server-rendered SVG chart of the published reports (no script, nothing from another host)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

WIDTH, HEIGHT, PAD = 640, 90, 6

SERIES = (
    ("revenue", "Revenue", "#2b6cb0"),
    ("units", "Units", "#2f855a"),
    ("refunds", "Refunds", "#c05621"),
    ("returns", "Returns", "#9b2c2c"),
)


@dataclass(frozen=True)
class Panel:
    """One metric over the days: its polyline points, bar positions and scale."""

    key: str
    label: str
    colour: str
    points: str
    dots: list[tuple[float, float, str]]
    maximum: str
    width: int = WIDTH
    height: int = HEIGHT


def panels(reports: Sequence) -> list[Panel]:
    """Return one panel per metric for `reports` in date order (each on its own scale)."""
    reports = sorted(reports, key=lambda r: r.date)
    result = []
    count = len(reports)
    for key, label, colour in SERIES:
        values = [Decimal(getattr(r, key)) for r in reports]
        top = max(values, default=Decimal(0)) or Decimal(1)
        coords = []
        for index, (report, value) in enumerate(zip(reports, values, strict=True)):
            x = PAD + (WIDTH - 2 * PAD) * (index / (count - 1) if count > 1 else 0.5)
            y = HEIGHT - PAD - float(value / top) * (HEIGHT - 2 * PAD)
            coords.append((round(x, 1), round(y, 1), f"{report.date}: {value}"))
        result.append(
            Panel(
                key=key,
                label=label,
                colour=colour,
                points=" ".join(f"{x},{y}" for x, y, _ in coords),
                dots=coords,
                maximum=str(max(values, default=0)),
            )
        )
    return result
