"""Every attack of the hardening review at once, briefly (bench/soak.py
runs the long version and reports latency): the server stays up, a
well-behaved client keeps being answered, and memory stays within what
the settings allow."""

from __future__ import annotations

import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
sys.path.insert(0, os.path.abspath(BENCH))

import soak  # noqa: E402  (bench/ is not a package)

pytestmark = pytest.mark.untraced


@pytest.mark.release_only
def test_combined_attacks_leave_the_server_up_bounded_and_answering():
    result = soak.run_soak(seconds=6, buckets=50_000, rules=500)
    assert result.alive
    # No request of the good client went unanswered for the client's timeout.
    assert max(result.attacked_ms) < soak.GOOD_TIMEOUT_S * 1000
    assert result.peak_total <= result.bound, soak.report(result, 6)
    # Protocol errors and the rest are not logged per connection.
    assert result.log_lines < 200, soak.report(result, 6)
