"""gunicorn.conf.py's post_worker_init: a worker's dead reference cycles do not pile up.

Each case runs in its own process (gc.freeze() is for the whole process): the
application loaded as a gunicorn worker loads it, then "requests" that each
hold a graph of containers in a reference cycle while they run (so the young
collections promote part of it, as they do a real request's), then drop it.
Sampled every 50 requests: the objects the collector holds beyond those it
held before the first request, i.e. the dead cycles still waiting for a
full collection (docs/runs/bench.md, "Goal 4").
"""

from __future__ import annotations

import os
import subprocess
import sys

from django.conf import settings

_CHILD = """
import gc, runpy, sys
from config.wsgi import application  # what a worker has loaded when the hook runs
if sys.argv[1] == "hook":
    runpy.run_path("gunicorn.conf.py")["post_worker_init"](None)
else:
    gc.collect()
held_before = len(gc.get_objects())
peak = 0
class Request:
    pass
for i in range(3000):
    request = Request()
    request.me = request
    request.parts = [[j] for j in range(300)]
    del request
    if i % 50 == 0:
        peak = max(peak, len(gc.get_objects()) - held_before)
print(peak)
"""


def _peak_dead_objects(mode: str) -> int:
    answer = subprocess.run(
        [sys.executable, "-c", _CHILD, mode],
        env=dict(os.environ),
        cwd=settings.BASE_DIR,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return int(answer.stdout.split()[-1])


def test_a_worker_collects_its_dead_cycles_every_few_requests():
    # Without the hook the oldest generation waits for 25 % of the loaded
    # application's ~90,000 objects before a full collection: the control
    # shows the pile the hook prevents (and that this test can see it).
    assert _peak_dead_objects("none") > 20_000
    assert _peak_dead_objects("hook") < 10_000
