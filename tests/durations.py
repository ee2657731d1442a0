"""Per-file durations of the suite: recorded by a run, read by the scheduler (tests/conftest.py).

Each test file's wall time (the sum of its tests' setup, call and teardown, module fixtures included)
and CPU time (the worker's own and that of the processes it waited for: trainings, synths, servers)
go to ``.pytest_cache/durations.json`` after every run; ``--record-durations`` also merges them into
the committed :data:`RECORDED`, which the scheduler reads to start the longest files first. A file the
record does not know yet is assumed to take :data:`UNKNOWN_FILE_S`, so a new file is not left to the end.
"""
from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest

RECORDED = Path(__file__).resolve().parent / "durations.json"
# A new test file, until a recorded run knows it: a little above the record's median file (12 s), so a
# new file that trains is not left to the end.
UNKNOWN_FILE_S = 20.0


def load(path: Path = RECORDED) -> dict[str, dict[str, float]]:
    try:
        return json.loads(path.read_text())["files"]
    except (OSError, ValueError, KeyError):
        return {}


def expected_seconds(files: dict[str, dict[str, float]], test_file: str) -> float:
    entry = files.get(test_file)
    return entry["wall_s"] if entry else UNKNOWN_FILE_S


def _cpu_seconds() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


class Recorder:
    """A pytest plugin: on each worker it adds the CPU time of every test to the test's teardown
    report; on the controller (or a run without xdist) it sums the reports per file and writes them."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.files: dict[str, dict[str, float]] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        item._cpu_at_start = _cpu_seconds()
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        if call.when == "teardown" and hasattr(item, "_cpu_at_start"):
            own, children = _cpu_seconds()
            report = outcome.get_result()
            report.user_properties.append(("cpu_s", (own - item._cpu_at_start[0])
                                           + (children - item._cpu_at_start[1])))

    def pytest_runtest_logreport(self, report):
        test_file = report.nodeid.split("::", 1)[0]
        entry = self.files.setdefault(test_file, {"wall_s": 0.0, "cpu_s": 0.0, "tests": 0})
        entry["wall_s"] += report.duration
        for key, value in report.user_properties:
            if key == "cpu_s":
                entry["cpu_s"] += value
                entry["tests"] += 1

    def pytest_sessionfinish(self, session):
        if hasattr(self.config, "workerinput") or not self.files:
            return  # a worker: the controller writes
        files = {name: {"wall_s": round(e["wall_s"], 1), "cpu_s": round(e["cpu_s"], 1), "tests": e["tests"]}
                 for name, e in sorted(self.files.items())}
        cache = Path(self.config.rootpath) / ".pytest_cache" / "durations.json"
        cache.parent.mkdir(exist_ok=True)
        cache.write_text(json.dumps({"files": files}, indent=1) + "\n")
        if self.config.getoption("record_durations"):
            merged = {**load(), **files}
            RECORDED.write_text(json.dumps({
                "about": "Per-file wall and CPU seconds of a full run on 2 cores (tests/durations.py); "
                         "the scheduler starts the longest files first. Refresh: "
                         ".venv/bin/python -m pytest --record-durations",
                "files": dict(sorted(merged.items()))}, indent=1) + "\n")
