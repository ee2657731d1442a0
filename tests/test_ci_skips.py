"""With CI=true a skip fails the run unless the allow-list names the test; outside CI a skip stays a
skip (tests/ci_skips.py). Each case is a pytest run of its own, with and without xdist workers."""
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent

SKIPS = """
import pytest


def test_runs():
    pass


def test_skips():
    pytest.skip("no widget here")


@pytest.mark.skipif(True, reason="marked to skip")
def test_marked():
    pass


@pytest.fixture
def widget():
    pytest.skip("the fixture found no widget")


def test_skips_in_its_fixture(widget):
    pass


@pytest.mark.xfail(reason="a known bug")
def test_xfails():
    assert False


@pytest.mark.parametrize("widget", [])
def test_without_parameters(widget):
    pass


def test_allowed():
    pytest.skip("allowed to skip")


@pytest.mark.parametrize("n", [1, 2])
def test_allowed_with_parameters(n):
    pytest.skip("allowed to skip")
"""

# The allow-list as the suite's own hooks read it, with two entries for this run.
ALLOW = """
import ci_skips

ci_skips.ALLOWED_SKIPS.update({"test_skips.py::test_allowed": "shows an allowed skip",
                               "test_skips.py::test_allowed_with_parameters": "shows an allowed skip"})
"""

WORKERS = pytest.mark.parametrize("workers", [["-p", "no:xdist"], ["-n", "2"]], ids=["serial", "xdist"])


def _run(pytester, monkeypatch, workers, *, ci: bool):
    if ci:
        monkeypatch.setenv("CI", "true")
    else:
        monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(TESTS))   # ci_skips and machine
    return pytester.runpytest_subprocess("-p", "ci_skips", "-p", "no:cacheprovider", "-ra", *workers)


@WORKERS
def test_in_ci_an_unexpected_skip_or_xfail_fails_and_an_allowed_skip_does_not(pytester, monkeypatch, workers):
    pytester.makepyfile(test_skips=SKIPS, conftest=ALLOW)
    result = _run(pytester, monkeypatch, workers, ci=True)
    # a skip in setup (a skipif mark, a fixture's skip, no parameters) becomes an error there
    result.assert_outcomes(passed=1, failed=2, errors=3, skipped=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    for nodeid, what, reason in [("test_skips", "skipped", "no widget here"),
                                 ("test_marked", "skipped", "marked to skip"),
                                 ("test_skips_in_its_fixture", "skipped", "the fixture found no widget"),
                                 ("test_xfails", "xfailed", "a known bug"),
                                 ("test_without_parameters[NOTSET]", "skipped", "got empty parameter set")]:
        assert f"test_skips.py::{nodeid} {what} in CI ({reason}" in out, out
    assert "add its node id with the reason to ALLOWED_SKIPS in tests/ci_skips.py" in out
    assert "test_allowed" not in "".join(line for line in out.splitlines() if line.startswith(("FAILED", "ERROR")))


@WORKERS
def test_outside_ci_skips_stay_skips(pytester, monkeypatch, workers):
    pytester.makepyfile(test_skips=SKIPS, conftest=ALLOW)
    result = _run(pytester, monkeypatch, workers, ci=False)
    result.assert_outcomes(passed=1, skipped=7, xfailed=1)
    assert result.ret == pytest.ExitCode.OK


@WORKERS
@pytest.mark.parametrize("ci", [True, False], ids=["ci", "not-ci"])
def test_a_module_that_skips_whole_is_an_error_in_ci(pytester, monkeypatch, workers, ci):
    pytester.makepyfile(test_module_skips="""
        import pytest

        pytest.skip("this module's widget is missing", allow_module_level=True)


        def test_never_collected():
            pass
    """, test_runs="def test_runs():\n    pass\n")
    result = _run(pytester, monkeypatch, workers, ci=ci)
    if ci:
        # a collection error stops a serial run before test_runs; xdist's workers run it
        assert result.parseoutcomes()["errors"] == 1 and "skipped" not in result.parseoutcomes()
        assert result.ret in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.TESTS_FAILED)
        assert "test_module_skips.py skipped in CI (this module's widget is missing)" in result.stdout.str()
    else:
        result.assert_outcomes(passed=1, skipped=1)
        assert result.ret == pytest.ExitCode.OK
