"""Python start-up of the chaos run's skewed host only (its PYTHONPATH; dev tooling).

libfaketime 0.9.10 (Debian's) shifts the wall clock and, left alone, the
monotonic clock too, where `threading` waits then last the offset (5 min)
instead of their timeout. With the monotonic clock excluded
(FAKETIME_DONT_FAKE_MONOTONIC=1), waits are right but `time.sleep` fails with
EINVAL: Python 3.11 sleeps with clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME),
which that libfaketime rewrites wrongly. So sleep here waits in select(),
which libfaketime leaves alone; nothing else changes.
"""

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = _sleep
