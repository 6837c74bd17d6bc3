"""The xdist workers' file order: longest first, from the cache, else from LONGEST."""

from __future__ import annotations

from types import SimpleNamespace

from tests.support.file_order import FILE_SECONDS, LONGEST, FileSeconds, order_longest_first


class Cache(dict):
    def get(self, key, default):  # pytest's Cache.get(key, default)
        return super().get(key, default)

    def set(self, key, value):
        self[key] = value


def items(*nodeids: str) -> list:
    return [SimpleNamespace(nodeid=nodeid) for nodeid in nodeids]


def ids(found) -> list[str]:
    return [item.nodeid for item in found]


def test_a_fresh_clone_hands_out_the_known_longest_files_first_then_by_test_count():
    found = items("tests/a.py::x", "tests/b.py::x", "tests/b.py::y", f"{LONGEST[1]}::z")
    found.append(SimpleNamespace(nodeid=f"{LONGEST[0]}::w"))
    order_longest_first(SimpleNamespace(cache=Cache()), found)
    assert ids(found) == [
        f"{LONGEST[0]}::w",
        f"{LONGEST[1]}::z",
        "tests/b.py::x",
        "tests/b.py::y",
        "tests/a.py::x",
    ]


def test_the_last_runs_seconds_decide_and_a_files_own_order_is_kept():
    cache = Cache({FILE_SECONDS: {"tests/a.py": 90.0, "tests/b.py": 3.0}})
    found = items("tests/b.py::x", "tests/a.py::second", "tests/a.py::first", "tests/c.py::x")
    order_longest_first(SimpleNamespace(cache=cache), found)
    assert ids(found) == [
        "tests/a.py::second",
        "tests/a.py::first",
        "tests/b.py::x",
        "tests/c.py::x",
    ]


def test_the_controller_merges_a_runs_seconds_into_the_cache():
    cache = Cache({FILE_SECONDS: {"tests/a.py": 90.0, "tests/b.py": 3.0}})
    record = FileSeconds()
    for phase in (1.0, 2.5, 0.5):
        record.pytest_runtest_logreport(SimpleNamespace(nodeid="tests/b.py::x", duration=phase))
    record.pytest_sessionfinish(SimpleNamespace(config=SimpleNamespace(cache=cache)))
    assert cache[FILE_SECONDS] == {"tests/a.py": 90.0, "tests/b.py": 4.0}


def test_every_file_named_longest_exists():
    from tests.support.file_order import ROOT

    assert [name for name in LONGEST if not (ROOT / name).is_file()] == []
