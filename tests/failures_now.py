"""A pytest plugin (`-p tests.failures_now`) for the GPU script: each failed test's report is
appended to the file named by FAILURES_FILE as soon as the test fails. The GPU machine stops a
step at its time limit, before pytest prints its summary, and a run cut short would otherwise
say which tests failed but not why."""

import os


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get("FAILURES_FILE")
    if path and report.failed:
        with open(path, "a") as f:
            f.write(f"== {report.nodeid} ({report.when})\n{report.longreprtext}\n")
            for name, text in report.sections:  # its captured log (a capture's warning, say) and output
                f.write(f"-- {name}\n{text[-4000:]}\n")
            f.write("\n")
