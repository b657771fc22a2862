"""The `limits` project's own tests (test_strategy.py, test_storage.py and
their aio twins, from its source distribution) against a real fastlimit
server, fastlimit added to their storage parameters by limits_suite_shim.py.
Only their fastlimit cases run (``-m fastlimit``): the others need their
docker containers.  Cases that do not apply: none are skipped today; their
unparametrized cases (pluggable storages, error wrapping with their own
storage class) involve no server storage and are deselected with the rest.
The ones they mark flaky (real time: two sleeps, then a reset time within
0.58 s) are rerun once on failure, as their CI does (the flaky plugin).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sdist import limits_source
from servers import ServerProcess, untraced_env

HERE = Path(__file__).resolve().parent
FILES = ["tests/test_strategy.py", "tests/test_storage.py",
         "tests/aio/test_strategy.py", "tests/aio/test_storage.py"]
# Their cases sleep through real windows (about a minute in all here).
TIMEOUT_S = 420


def failures(out: str) -> str:
    """Their report's failures, else its end (the warnings after them can
    fill any tail)."""
    start = out.find("= FAILURES =")
    return out[start:start + 6000] if start >= 0 else out[-6000:]


@pytest.mark.serial
def test_the_limits_projects_tests_pass_against_fastlimit():
    tree = limits_source()
    server = ServerProcess().start()          # the real clock: their tests sleep
    try:
        env = {**untraced_env(), "FASTLIMIT_LIMITS_URI": f"fastlimit://127.0.0.1:{server.port}",
               "PYTHONPATH": str(HERE)}
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-c", str(HERE / "limits_suite.ini"),
             "--rootdir", str(tree), "--noconftest", "-p", "limits_suite_shim",
             "-p", "no:cacheprovider", "-q", *FILES],
            cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    finally:
        server.stop()
    out = run.stdout + run.stderr
    assert run.returncode == 0, failures(out)
    summary = re.search(r"(\d+) passed", out)
    assert summary and int(summary.group(1)) >= 55, out[-3000:]
    assert not re.search(r"\d+ (failed|error|skipped)", out), out[-3000:]
    assert os.path.isdir(tree)
