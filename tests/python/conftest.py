"""pytest configuration shared by the tests of pipesgd.torch (tests/python).

Under mpirun every rank runs the same test functions in the same order, so their collectives match.
When a test fails on one rank while its peers go on, they would wait on it until the timeout: this
hook makes the failing rank fail its session (pipesgd's Session.fail) so that every peer's next
wait raises PeerFailedError at once, naming the rank and the test.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # psgd_testlib


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    hvd = sys.modules.get("pipesgd.torch")
    if hvd is None or hvd._state.session is None or hvd._state.failed or hvd._state.worker is None:
        return
    if hvd._state.worker.size + hvd._state.servers <= 1:
        return  # no peer waits on this process
    hvd._state.failed = True
    hvd._state.session.fail(f"pytest: {item.nodeid} failed on rank {hvd._state.worker.rank}")
    # Session.fail destroys the C++ Worker that _state.worker refers to: later calls (a fixture's
    # teardown) must raise ValueError ("not initialized"), not crash on it (see test_errors.py,
    # test_uncaught_exception_in_an_interactive_session_does_not_crash).
    hvd._state.worker = None
