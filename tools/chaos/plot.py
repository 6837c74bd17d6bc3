"""The chaos run's plot: answers per second over time, kills and restarts marked, each
dependency fault a band from its start to its heal (one colour per kind)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

BIN = 5.0  # seconds per bar of the throughput curve
CLASSES = (("2xx", "tab:green"), ("4xx", "tab:blue"), ("5xx", "tab:red"), ("none", "tab:gray"))
MARKERS = {
    "kill": ("tab:red", ":", "SIGKILL"),
    "failpoint": ("tab:purple", "--", "failpoint exit"),
    "redis_restart": ("black", "-", "Redis restarted empty"),
    "broker_restart": ("tab:orange", "-", "broker vhost recreated"),
}
# One colour per fault kind; each fault is a band from its start to its heal.
FAULT_COLOURS = {
    "pg_crash": "tab:red",
    "pg_hang": "tab:pink",
    "db_partition": "tab:brown",
    "db_reset": "tab:olive",
    "broker_partition": "tab:orange",
    "redis_hang": "tab:cyan",
    "memory_alarm": "gold",
    "provider_kill": "tab:purple",
    "supervisor_kill": "tab:gray",
}


def _class(status: int | None) -> str:
    if status is None:
        return "none"
    return f"{status // 100}xx" if status >= 200 else "none"


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a crash of the driver itself
    return rows


def plot(run_dir: Path, *, title: str) -> Path:
    """Draw RUN_DIR/chaos.png from answers.jsonl and timeline.jsonl; return its path."""
    answers = read_jsonl(run_dir / "answers.jsonl")
    timeline = read_jsonl(run_dir / "timeline.jsonl")
    start_t = [r["t"] for r in timeline if r.get("type") == "workload_start"]
    t0 = start_t[0] if start_t else min((a["t"] for a in answers), default=0.0)
    bins: dict[str, Counter[int]] = {name: Counter() for name, _ in CLASSES}
    for answer in answers:
        bins[_class(answer.get("status"))][int((answer["t"] - t0) // BIN)] += 1
    last = max((max(c, default=0) for c in bins.values()), default=0)
    xs = [i * BIN for i in range(last + 1)]
    # matplotlib is tooling (requirements/tools.txt): imported where a plot is drawn.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.8))
    for name, colour in CLASSES:
        ax.plot(xs, [bins[name][i] / BIN for i in range(last + 1)], label=name, color=colour)
    seen: set[str] = set()
    for event in timeline:
        style = MARKERS.get(event.get("type", ""))
        if style is None:
            continue
        colour, dash, label = style
        ax.axvline(
            event["t"] - t0,
            color=colour,
            linestyle=dash,
            alpha=0.45 if event["type"] in ("kill", "failpoint") else 0.9,
            linewidth=1,
            label=None if label in seen else label,
        )
        seen.add(label)
    for event in timeline:
        if event.get("type") != "fault":
            continue
        kind = event.get("kind", "?")
        start, end = event["t"] - t0, max(event.get("end") or event["t"], event["t"] + 0.5) - t0
        label = f"{kind} ({event.get('host', '*')})" if kind not in seen else None
        ax.axvspan(start, end, color=FAULT_COLOURS.get(kind, "tab:brown"), alpha=0.25,
                   label=f"fault: {kind}" if label else None)  # fmt: skip
        seen.add(kind)
    ax.set_xlabel("seconds since the workload started")
    ax.set_ylabel(f"answers per second ({BIN:.0f} s bins)")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize="small", ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = run_dir / "chaos.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
