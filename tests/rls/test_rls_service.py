"""The decision, against the golden vectors of envoyproxy/ratelimit's README
(notes §2.7 A-C) and the edge cases of its test/config/basic_config.yaml,
on a real engine with a manual clock."""

from __future__ import annotations

import pytest
from rls_tables import (
    BASIC,
    BASIC_MATCHES,
    D1,
    D2,
    DAY,
    EDGE_PER_IP,
    EXAMPLE7,
    MESSAGING,
    MINUTE,
    SECOND,
    lim,
)

from fastlimit.rls.service import MAX_UINT32, OK, OVER_LIMIT, RlsError


def test_messaging_counts_every_descriptor_even_when_another_is_over(rig):
    r = rig(MESSAGING)
    for i in range(5):
        overall, st, _ = r.call("messaging", D1, D2)
        assert overall == OK
        assert st[0][:3] == (OK, lim(5, DAY), 4 - i)
        assert st[1][:3] == (OK, lim(100, DAY), 99 - i)
        assert st[0][3] == 86400
    overall, st, _ = r.call("messaging", D1, D2)
    assert overall == OVER_LIMIT
    assert st[0][:3] == (OVER_LIMIT, lim(5, DAY), 0)
    assert st[1][:3] == (OK, lim(100, DAY), 94)
    assert r.call("messaging", D2)[1][0][:3] == (OK, lim(100, DAY), 93)
    other = [("message_type", "marketing"), ("to_number", "2062222222")]
    assert r.call("messaging", other)[1][0][:3] == (OK, lim(5, DAY), 4)
    transactional = [("message_type", "transactional"), ("to_number", "2061111111")]
    assert r.call("messaging", transactional) == (OK, [(OK, None, 0, 0)], [])


def test_edge_proxy_specific_value_beats_key_only_and_zero_blocks(rig):
    r = rig(EDGE_PER_IP)
    overall, st, _ = r.call("edge_proxy_per_ip", [("remote_address", "50.0.0.5")])
    assert (overall, st[0]) == (OVER_LIMIT, (OVER_LIMIT, lim(0, SECOND), 0, 1))
    for i in range(10):
        overall, st, _ = r.call("edge_proxy_per_ip", [("remote_address", "50.0.0.1")])
        assert (overall, st[0][2]) == (OK, 9 - i)
    overall, st, _ = r.call("edge_proxy_per_ip", [("remote_address", "50.0.0.1")])
    assert (overall, st[0][0], st[0][2]) == (OVER_LIMIT, OVER_LIMIT, 0)
    r.advance(1)
    assert r.call("edge_proxy_per_ip", [("remote_address", "50.0.0.1")])[1][0] == \
        (OK, lim(10, SECOND), 9, 1)
    deeper = [("remote_address", "50.0.0.1"), ("path", "/x")]
    assert r.call("edge_proxy_per_ip", deeper)[1] == [(OK, None, 0, 0)]


def test_example7_replaces_drops_and_does_not_count_the_named_limit(rig):
    r = rig(EXAMPLE7)
    d1 = [("key_1", "value_1"), ("user", "bkthomps")]
    d2 = [("key_2", "value_2"), ("user", "bkthomps")]
    for i in range(5):
        overall, st, _ = r.call("example7", d1)
        assert (overall, st[0][:3]) == (OK, (OK, lim(5, SECOND, b"specific_limit"), 4 - i))
    assert r.call("example7", d1)[0] == OVER_LIMIT
    r.advance(1)
    for i in range(10):
        overall, st, _ = r.call("example7", d1, d2)
        assert overall == OK
        assert st[0] == (OK, None, 0, 0)
        assert st[1][:3] == (OK, lim(10, SECOND), 9 - i)
    overall, st, _ = r.call("example7", d1, d2)
    assert (overall, st[0], st[1][0]) == (OVER_LIMIT, (OK, None, 0, 0), OVER_LIMIT)
    assert r.call("example7", d1)[1][0][:3] == (OK, lim(5, SECOND, b"specific_limit"), 4)


@pytest.mark.parametrize("entries, expected", BASIC_MATCHES)
def test_basic_config_matching(rig, entries, expected):
    st = rig(BASIC).call("test-domain", entries)[1][0]
    assert st[1] == expected


def test_unlimited_is_ok_with_the_largest_remaining_and_no_limit(rig):
    assert rig(BASIC).call("test-domain", [("key6", "x")])[1] == [(OK, None, MAX_UINT32, 0)]


def test_shadow_mode_is_always_ok_but_counted(rig):
    r = rig(BASIC)
    for remaining in (1, 0, 0, 0):
        overall, st, _ = r.call("test-domain", [("user", "user-a")])
        assert (overall, st[0][:3]) == (OK, (OK, lim(2, SECOND), remaining))
    assert r.service.stats[b"test-domain"].shadow == 2


def test_share_threshold_makes_matching_values_share_one_counter(rig):
    r = rig(BASIC)
    for name in ["files/a.pdf"] * 5 + ["files/b.csv"] * 5:
        assert r.call("test-domain", [("files", name)])[0] == OK
    assert r.call("test-domain", [("files", "files/c.txt")])[0] == OVER_LIMIT


def test_descriptor_limit_override_applies_even_to_an_unknown_key(rig):
    r = rig(BASIC)
    d = ([("unknown", "k")], (3, MINUTE), None)
    assert [r.call("test-domain", d)[1][0][:3] for _ in range(4)] == [
        (OK, lim(3, MINUTE), 2), (OK, lim(3, MINUTE), 1), (OK, lim(3, MINUTE), 0),
        (OVER_LIMIT, lim(3, MINUTE), 0)]


def test_descriptor_hits_addend_zero_checks_without_counting(rig):
    r = rig(EDGE_PER_IP)
    check = ([("remote_address", "1.1.1.1")], None, 0)
    assert r.call("edge_proxy_per_ip", check)[1][0][2] == 10
    assert r.call("edge_proxy_per_ip", check)[1][0][2] == 10
    r.call("edge_proxy_per_ip", ([("remote_address", "1.1.1.1")], None, 10))
    assert r.call("edge_proxy_per_ip", check)[1][0][:3] == (OK, lim(10, SECOND), 0)
    r.call("edge_proxy_per_ip", [("remote_address", "1.1.1.1")])       # counted though over
    assert r.call("edge_proxy_per_ip", check)[1][0][0] == OVER_LIMIT


def test_request_hits_addend_zero_means_one_and_larger_counts_that_many(rig):
    r = rig(EDGE_PER_IP)
    assert r.call("edge_proxy_per_ip", [("remote_address", "2.2.2.2")], hits=0)[1][0][2] == 9
    assert r.call("edge_proxy_per_ip", [("remote_address", "2.2.2.2")], hits=4)[1][0][2] == 5


def test_unknown_domain_is_all_ok(rig):
    assert rig(EDGE_PER_IP).call("nope", [("a", "b")], [("c", "d")]) == \
        (OK, [(OK, None, 0, 0)] * 2, [])


@pytest.mark.parametrize("domain, descriptors, message", [
    (b"", [([(b"a", b"b")], None, None)], "rate limit domain must not be empty"),
    (b"edge_proxy_per_ip", [], "rate limit descriptor list must not be empty"),
])
def test_empty_domain_or_descriptors_is_an_error_worded_as_the_reference(
        rig, domain, descriptors, message):
    with pytest.raises(RlsError, match=f"^{message}$"):
        rig(EDGE_PER_IP).service.should_rate_limit(domain, descriptors, 1)


def test_windows_are_aligned_to_the_unix_epoch(rig):
    r = rig(EDGE_PER_IP)
    r.advance(0.999)
    for _ in range(10):
        r.call("edge_proxy_per_ip", [("remote_address", "3.3.3.3")])
    r.advance(0.001)        # the next whole second of Unix time: a new window
    assert r.call("edge_proxy_per_ip", [("remote_address", "3.3.3.3")])[1][0][2] == 9


QUOTA = """
domain: q
descriptors:
  - key: a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
"""


def test_quota_mode_is_over_only_when_every_quota_descriptor_is_over(rig):
    r = rig(QUOTA)
    r.call("q", [("a", "1")])
    overall, st, _ = r.call("q", [("a", "1")], [("b", "1")])
    assert (overall, st[0][0], st[1][0]) == (OK, OVER_LIMIT, OK)
    assert r.call("q", [("a", "1")], [("b", "1")])[0] == OVER_LIMIT


BEYOND = """
domain: beyond
counting: atomic
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 3, algorithm: token_bucket}
      - {unit: minute, requests_per_unit: 5}
  - key: route
    rate_limit: {unit: second, requests_per_unit: 2, unit_multiplier: 10}
"""


def test_several_limits_on_one_descriptor_the_tighter_binds(rig):
    r = rig(BEYOND)
    results = [r.call("beyond", [("user", "u")])[1][0] for _ in range(4)]
    assert [s[0] for s in results] == [OK, OK, OK, OVER_LIMIT]    # the bucket of 3
    assert results[0][1] == lim(3, SECOND)
    r.advance(1)
    assert r.call("beyond", [("user", "u")])[1][0][:3] == (OK, lim(5, MINUTE), 1)
    r.advance(1)
    assert r.call("beyond", [("user", "u")])[1][0][:3] == (OK, lim(5, MINUTE), 0)
    r.advance(1)
    assert r.call("beyond", [("user", "u")])[1][0][:3] == (OVER_LIMIT, lim(5, MINUTE), 0)


def test_unit_multiplier_makes_a_window_of_that_many_units(rig):
    r = rig(BEYOND)
    r.call("beyond", [("route", "x")])
    r.call("beyond", [("route", "x")])
    r.advance(9)
    overall, st, _ = r.call("beyond", [("route", "x")])
    assert (overall, st[0][3]) == (OVER_LIMIT, 1)
    r.advance(1)
    assert r.call("beyond", [("route", "x")])[0] == OK


def test_atomic_counting_spends_nothing_unless_every_descriptor_passes(rig):
    r = rig(BEYOND)
    r.call("beyond", [("route", "x")])
    r.call("beyond", [("route", "x")])
    overall, st, _ = r.call("beyond", [("user", "u")], [("route", "x")])
    assert (overall, st[0][:3], st[1][0]) == (OVER_LIMIT, (OK, lim(3, SECOND), 3), OVER_LIMIT)
    # the user's limits were not spent: three more pass
    assert [r.call("beyond", [("user", "u")])[0] for _ in range(4)] == [OK, OK, OK, OVER_LIMIT]


def test_reference_counting_spends_the_passing_descriptor_when_another_is_over(rig):
    r = rig(BEYOND.replace("counting: atomic", "counting: reference"))
    r.call("beyond", [("route", "x")])
    r.call("beyond", [("route", "x")])
    assert r.call("beyond", [("user", "u")], [("route", "x")])[0] == OVER_LIMIT
    assert [r.call("beyond", [("user", "u")])[0] for _ in range(3)] == [OK, OK, OVER_LIMIT]


def test_response_headers_describe_the_tightest_status_and_retry_after_when_over(rig):
    r = rig(EDGE_PER_IP, headers=True)
    _, _, headers = r.call("edge_proxy_per_ip", [("remote_address", "4.4.4.4")])
    assert headers == [(b"RateLimit-Policy", b'"edge_proxy_per_ip.remote_address";q=10;w=1'),
                       (b"RateLimit", b'"edge_proxy_per_ip.remote_address";r=9;t=1')]
    _, _, headers = r.call("edge_proxy_per_ip", [("remote_address", "50.0.0.5")])
    assert headers[-1] == (b"Retry-After", b"1")


def test_a_reload_keeps_counts_when_only_requests_per_unit_changes(rig):
    r = rig(EDGE_PER_IP)
    for _ in range(4):
        r.call("edge_proxy_per_ip", [("remote_address", "5.5.5.5")])
    r.load(EDGE_PER_IP.replace("requests_per_unit: 10", "requests_per_unit: 20"))
    assert r.call("edge_proxy_per_ip", [("remote_address", "5.5.5.5")])[1][0][2] == 15


YEARLY = """
domain: y
descriptors:
  - key: k
    rate_limit: {unit: year, requests_per_unit: 2}
"""


def test_a_year_window_longer_than_the_engine_s_counts_across_it_and_starts_over_after(rig):
    r = rig(YEARLY)
    year_s = 365 * 86400
    left = year_s - (r.clock.now() // 1000) % year_s       # seconds to the next year window
    assert left > 100 * 86400                                # longer than any engine window
    assert r.call("y", [("k", "v")])[1][0][2:] == (1, left)
    r.advance(left - 1)                                      # the window's last second
    assert r.call("y", [("k", "v")])[1][0][2:] == (0, 1)
    assert r.call("y", [("k", "v")])[0] == OVER_LIMIT
    r.advance(1)
    assert r.call("y", [("k", "v")])[1][0][:3] == (OK, (2, 6, b""), 1)


def test_counters_are_buckets_of_the_engine_and_a_check_only_call_writes_none(rig):
    r = rig(MESSAGING)
    r.call("messaging", ([("to_number", "1")], None, 0))
    assert len(r.engine) == 0
    r.call("messaging", D1, D2)
    assert len(r.engine) == 2
    # past the day's window, with time enough for a traced debug build
    r.engine.sweep(now_ms=r.clock.now() + 86_400_000 + 1000, budget_ms=10_000)
    assert len(r.engine) == 0


SPLIT = """
domain: hot
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: token_bucket, split: 4}
"""


def test_a_split_descriptor_limit_admits_its_limit_over_sub_buckets(rig):
    """split: k makes each of the descriptor's buckets k sub-buckets
    (README "Split keys"): never more than the limit, denied only when the
    two sub-buckets tried are empty, so nearly all of it at a demand of
    twice the limit."""
    r = rig(SPLIT)
    statuses = [r.call("hot", [("tenant", "acme")])[1][0] for _ in range(200)]
    allowed = sum(s[0] == OK for s in statuses)
    assert 90 <= allowed <= 100
    assert statuses[0][1] == lim(100, MINUTE)
