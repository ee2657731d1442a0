"""In CI (``CI=true``) a skipped or xfailed test fails, unless :data:`ALLOWED_SKIPS` names it.

CI installs everything the suite needs and runs as root, so a test that skips there hides a check
that was meant to run. A test that needs something of the machine calls tests/machine.py's
``require`` (a skip outside CI, a failure in CI); this plugin catches every other skip: a
``skipif`` mark, ``pytest.skip``, ``importorskip``, an empty parameter set, a module-level skip
(an error at collection), and an ``xfail``.

tests/conftest.py registers this plugin for the suite; tests/test_ci_skips.py runs them with ``-p ci_skips``.
"""
from __future__ import annotations

import pytest

from machine import in_ci

# Tests that may skip in CI: node id (a test, a test without its parameters, or a whole file) ->
# why skipping there hides nothing. Each entry needs a reason a reviewer would accept.
ALLOWED_SKIPS: dict[str, str] = {}


def allowed(nodeid: str) -> str | None:
    """Why ``nodeid`` may skip in CI, or None."""
    for entry, reason in ALLOWED_SKIPS.items():
        if nodeid == entry or nodeid.startswith((entry + "[", entry + "::")):
            return reason
    return None


def _fail_if_unexpected(report):
    if not report.skipped or not in_ci() or allowed(report.nodeid):
        return report
    if hasattr(report, "wasxfail"):
        what, reason = "xfailed", report.wasxfail
        del report.wasxfail
    else:
        what, reason = "skipped", report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
    report.outcome = "failed"
    report.longrepr = (f"{report.nodeid} {what} in CI ({reason}): with CI=true every test must run. Make it "
                       f"run on the CI machine (tests/machine.py's require fails it there with what is "
                       f"missing), or, if it cannot run in CI by design, add its node id with the reason "
                       f"to ALLOWED_SKIPS in tests/ci_skips.py.")
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    # tryfirst: the outermost wrapper, so it sees the report after pytest's skipping plugin set xfail
    return _fail_if_unexpected((yield))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_make_collect_report(collector):
    return _fail_if_unexpected((yield))
