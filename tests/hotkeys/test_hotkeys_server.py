"""HOTKEYS, INFO hotkeys, /metrics and the status page (its snapshot, and the
page in Chromium) on a real
server over real sockets (redis-py, RESP2 and RESP3; HTTP), on the manual
clock: continuous tracking answers without a START; a session counts with
its own COUNT and SAMPLE until its DURATION; CL.CHECK, CL.LIMIT (a rule's
bucket) and the HTTP check endpoints are counted; the tracker's memory does
not grow with distinct keys; one hot key among a million cold ones is
ranked first."""

from __future__ import annotations

import json
import socket
import time

import pytest
import redis
from cdp import Chromium, console_problems
from metrics_text import named, samples
from resp_values import Raw, info_fields


def by_ops(reply) -> list[tuple[bytes, int]]:
    pairs = reply[b"by-ops"]
    return list(zip(pairs[::2], pairs[1::2], strict=True))


def get(c) -> dict:
    """HOTKEYS GET's one map (redis-py makes RESP2's pairs a dict too)."""
    reply = c.hotkeys_get() if c.get_connection_kwargs().get("protocol") == 2 else \
        c.execute_command("HOTKEYS", "GET")
    assert isinstance(reply, list) and len(reply) == 1
    return reply[0]


def details(reply) -> list[dict]:
    """by-ops-detail's maps (flat pairs on RESP2)."""
    return [d if isinstance(d, dict) else dict(zip(d[::2], d[1::2], strict=True))
            for d in reply[b"by-ops-detail"]]


def checks(c, keys) -> None:
    pipe = c.pipeline(transaction=False)
    for key in keys:
        pipe.execute_command("CL.CHECK", key, 1000, 10)
    pipe.execute()


@pytest.fixture
def c(hs):
    client = hs.client(protocol=2)
    yield client
    client.close()


def test_get_without_start_ranks_the_hot_key_first_with_its_rate(hs, c):
    # 4000 checks in 2 s of server time, half of them on "hot"
    for step in range(4):
        checks(c, [b"hot" if i % 2 else b"cold:%d:%d" % (step, i) for i in range(1000)])
        c.execute_command("DEBUG", "CLOCK", "ADVANCE", 500)
    g = get(c)
    assert g[b"tracking-active"] == 1 and g[b"mode"] == b"continuous"
    assert (g[b"sample-ratio"], g[b"top-k"], g[b"half-life-ms"]) == (16, 32, 10_000)
    assert g[b"selected-slots"] == []
    assert g[b"collection-start-time-unix-ms"] == 0 and g[b"collection-duration-ms"] == 2000
    ranked = by_ops(g)
    assert ranked[0][0] == b"hot"
    assert 600 <= ranked[0][1] <= 1400            # 1000 a second, sampled 1 in 16
    detail = details(g)[0]
    assert detail[b"key"] == b"hot" and detail[b"source"] == b"bucket"
    assert detail[b"ops-min"] <= detail[b"ops"]
    assert len(ranked) <= 32
    # RESP3: the same fields as a map in a one-element array
    r3 = hs.client(protocol=3)
    reply = r3.execute_command("HOTKEYS", "GET")
    assert isinstance(reply, list) and isinstance(reply[0], dict)
    assert by_ops(reply[0])[0][0] == b"hot"


def test_a_session_counts_every_check_at_sample_1_until_its_duration(c):
    assert c.execute_command("HOTKEYS", "START", "METRICS", 1, "OPS", "COUNT", 3, "SAMPLE", 1,
                             "DURATION", 10) == b"OK"
    checks(c, [b"a"] * 60 + [b"b"] * 30 + [b"c"] * 10)
    c.execute_command("DEBUG", "CLOCK", "ADVANCE", 2000)
    g = get(c)
    assert (g[b"mode"], g[b"tracking-active"], g[b"sample-ratio"], g[b"top-k"]) == (
        b"session", 1, 1, 3)
    assert g[b"checks"] == g[b"sampled-checks"] == 100
    assert by_ops(g) == [(b"a", 30), (b"b", 15), (b"c", 5)]     # exact: all fit, 2 s
    assert [(d[b"count"], d[b"error"]) for d in details(g)] == [
        (60, 0), (30, 0), (10, 0)]
    with pytest.raises(redis.ResponseError, match="session already in progress"):
        c.execute_command("HOTKEYS", "START", "METRICS", 1, "OPS")
    with pytest.raises(redis.ResponseError, match="stop tracking first"):
        c.hotkeys_reset()
    c.execute_command("DEBUG", "CLOCK", "ADVANCE", 8000)      # the session's 10 s are over
    checks(c, [b"late"] * 10)
    g = get(c)
    assert (g[b"mode"], g[b"tracking-active"]) == (b"session-stopped", 0)
    assert g[b"collection-duration-ms"] == 10_000
    assert [k for k, _ in by_ops(g)] == [b"a", b"b", b"c"]
    assert c.hotkeys_reset() == b"OK"                         # back to continuous tracking
    g = get(c)
    assert (g[b"mode"], g[b"sample-ratio"], g[b"top-k"], g[b"by-ops"]) == (
        b"continuous", 16, 32, [])


def test_stop_freezes_continuous_tracking_and_reset_resumes_it(c):
    assert c.hotkeys_stop() == b"OK"
    checks(c, [b"k"] * 500)
    g = get(c)
    assert (g[b"mode"], g[b"tracking-active"], g[b"by-ops"]) == (b"stopped", 0, [])
    assert c.hotkeys_reset() == b"OK"
    checks(c, [b"k"] * 500)
    assert get(c)[b"tracking-active"] == 1 and by_ops(get(c))[0][0] == b"k"


@pytest.mark.parametrize("args, error", [
    ((), "METRICS parameter is required"),
    (("COUNT", 3), "METRICS parameter is required"),
    (("METRICS",), "syntax error"),
    (("METRICS", 0, "OPS"), "METRICS count must be > 0 and <= 3"),
    (("METRICS", 2, "OPS"), "METRICS count does not match number of metric types provided"),
    (("METRICS", 1, "FOO"), "METRICS count does not match number of metric types provided"),
    (("METRICS", 2, "OPS", "OPS"), "METRICS OPS defined more than once!"),
    (("METRICS", 1, "CPU"), "METRICS CPU is not supported by fastlimit"),
    (("METRICS", 2, "OPS", "NET"), "METRICS NET is not supported by fastlimit"),
    (("METRICS", 1, "OPS", "COUNT", 0), "COUNT must be between 1 and 1024"),
    (("METRICS", 1, "OPS", "COUNT", 1025), "COUNT must be between 1 and 1024"),
    (("METRICS", 1, "OPS", "DURATION", 0), "DURATION must be between 1 and 1000000"),
    (("METRICS", 1, "OPS", "SAMPLE", 0), "SAMPLE ratio must be positive"),
    (("METRICS", 1, "OPS", "SAMPLE", "x"), "not an integer"),
    (("METRICS", 1, "OPS", "SLOTS", 1, 0), "SLOTS is not supported"),
    (("METRICS", 1, "OPS", "COUNT"), "syntax error"),
    (("METRICS", 1, "OPS", "BOGUS", 1), "syntax error"),
])
def test_start_refuses_bad_options_with_redis_texts(c, args, error):
    with pytest.raises(redis.ResponseError, match=error):
        c.execute_command("HOTKEYS", "START", *args)
    assert get(c)[b"mode"] == b"continuous"       # nothing changed


def test_redis_py_s_own_hotkeys_start_is_told_cpu_is_not_supported(c):
    with pytest.raises(redis.ResponseError, match="CPU is not supported"):
        c.hotkeys_start([redis.commands.core.HotkeysMetricsTypes.CPU], count=10)


def test_hotkeys_is_in_the_command_table_with_redis_s_categories(c):
    info = c.execute_command("COMMAND", "INFO", "HOTKEYS")["hotkeys"]
    assert info["arity"] == -2
    subs = {s[0]: s for s in info["subcommands"]}
    for name in (b"hotkeys|start", b"hotkeys|stop", b"hotkeys|get", b"hotkeys|reset"):
        assert set(subs[name][6]) == {b"@admin", b"@slow", b"@dangerous"}
    assert subs[b"hotkeys|start"][1] == -2 and subs[b"hotkeys|get"][1] == 2
    with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'hotkeys|get'"):
        c.execute_command("HOTKEYS", "GET", "x")
    c.execute_command("ACL", "SETUSER", "app", "on", ">pw", "+@all", "-@dangerous")
    app = redis.Redis(port=c.get_connection_kwargs()["port"], username="app", password="pw",
                      protocol=2)
    with pytest.raises(redis.exceptions.NoPermissionError):
        app.hotkeys_get()


def test_cl_limit_counts_each_rule_s_bucket_by_rule_client_and_resource(c):
    c.execute_command("CL.RULE", "SET", "per-client", json.dumps(
        {"match": {"resource": "api*"}, "capacity": 1000, "refill_per_second": 1}))
    c.execute_command("CL.RULE", "SET", "per-route", json.dumps(
        {"match": {"resource": "api*"}, "capacity": 1000, "refill_per_second": 1,
         "key": "client+resource"}))
    c.execute_command("HOTKEYS", "START", "METRICS", 1, "OPS", "SAMPLE", 1, "COUNT", 8)
    pipe = c.pipeline(transaction=False)
    for i in range(40):
        pipe.execute_command("CL.LIMIT", "tenant-a", "api/orders" if i % 4 else "api/users")
    for _ in range(5):           # CL.APPLY names its rules: the same buckets, counted too
        pipe.execute_command("CL.APPLY", "per-client", "tenant-b")
    pipe.execute()
    rows = {(d[b"rule"], d[b"client"], d.get(b"resource"), d[b"count"])
            for d in details(get(c))}
    assert rows == {(b"per-client", b"tenant-a", None, 40),
                    (b"per-route", b"tenant-a", b"api/orders", 30),
                    (b"per-route", b"tenant-a", b"api/users", 10),
                    (b"per-client", b"tenant-b", None, 5)}
    assert [k for k, _ in by_ops(get(c))][0] == b"per-client:tenant-a"


def test_the_http_check_endpoints_are_counted_by_the_same_hooks(hs, c):
    c.execute_command("CL.RULE", "SET", "api", json.dumps(
        {"match": {"resource": "api"}, "capacity": 1000, "refill_per_second": 1}))
    c.execute_command("HOTKEYS", "START", "METRICS", 1, "OPS", "SAMPLE", 1)
    for _ in range(5):
        status, _, _ = hs.request("POST", "/v1/check/bucket",
                               {"key": "via-http", "capacity": 10, "refill_per_sec": 1})
        assert status == 200
    for _ in range(3):
        assert hs.request("POST", "/v1/check", {"client_key": "t1", "resource": "api"})[0] == 200
    for _ in range(2):
        assert hs.request("POST", "/v1/limits/check", {"rule_id": "api", "key": "t2"})[0] == 200
    rows = {(d[b"key"], d[b"source"], d[b"count"]) for d in details(get(c))}
    assert rows == {(b"via-http", b"bucket", 5), (b"api:t1", b"rule", 3), (b"api:t2", b"rule", 2)}
    assert by_ops(get(c))[0] == (b"via-http", 0)          # the clock never moved: no rate


def test_info_hotkeys_by_name_lists_keys_and_default_info_only_counts(hs, c):
    c.execute_command("HOTKEYS", "START", "METRICS", 1, "OPS", "SAMPLE", 1)
    checks(c, [b'we"ird\r\nkey'] * 30 + [b"plain"] * 10)
    c.execute_command("DEBUG", "CLOCK", "ADVANCE", 1000)
    with Raw.to(hs.port) as raw:
        text = raw.value("INFO", "hotkeys")
    lines = info_fields(text)
    assert text.startswith(b"# Hotkeys\r\n")
    assert lines["hotkeys_tracking"] == "1" and lines["hotkeys_mode"] == "session"
    assert lines["hotkeys_tracked"] == "2" and lines["hotkeys_sampled_checks"] == "40"
    assert lines["hotkey_0"].startswith('key="we\\x22ird\\x0d\\x0akey",source=bucket,ops=30.0,')
    assert lines["hotkey_1"].startswith('key="plain",source=bucket,ops=10.0,')
    default = c.info()
    assert default["hotkeys_tracking"] == 1 and default["hotkeys_sampled_checks"] == 40
    assert default["hotkeys_tracker_bytes"] > 0
    assert not any(k.startswith("hotkey_") for k in default)


def test_metrics_name_no_key_by_default(hs, c):
    checks(c, [b"tenant-zq81"] * 500)
    assert by_ops(get(c))[0][0] == b"tenant-zq81"
    series = samples(hs.request("GET", "/metrics")[2].decode())
    assert named(series, "fastlimit_hotkey_ops_per_second") == {}
    assert b"tenant-zq81" not in hs.request("GET", "/metrics")[2]
    assert series[("fastlimit_hotkeys_tracking", frozenset())] == 1


def test_metrics_name_the_hottest_keys_bounded_and_escaped(make_http_server):
    hs = make_http_server("--manual-clock", "--hotkeys-metrics-keys", "2")
    c = hs.client(protocol=2)
    c.execute_command("HOTKEYS", "START", "METRICS", 1, "OPS", "SAMPLE", 1)
    checks(c, [b'a"b\\c\n' + b"x" * 100] * 30 + [b"two"] * 20 + [b"three"] * 10)
    c.execute_command("DEBUG", "CLOCK", "ADVANCE", 1000)
    status, _, body = hs.request("GET", "/metrics")
    assert status == 200
    series = samples(body.decode())
    rates = {dict(labels)["key"]: v for labels, v in
             named(series, "fastlimit_hotkey_ops_per_second").items()}
    long_key = 'a\\"b\\\\c\\n' + "x" * 58             # 64 bytes kept, then escaped
    assert rates == {long_key: 30.0, "two": 20.0}
    assert series[("fastlimit_hotkeys_tracking", frozenset())] == 1
    assert series[("fastlimit_hotkeys_sampled_checks_total", frozenset())] == 60
    c.config_set("hotkeys-metrics-keys", 0)
    series = samples(hs.request("GET", "/metrics")[2].decode())
    assert named(series, "fastlimit_hotkey_ops_per_second") == {}


def test_the_status_snapshot_lists_the_hot_keys(hs, c):
    c.execute_command("HOTKEYS", "START", "METRICS", 1, "OPS", "SAMPLE", 1)
    checks(c, [b"hot\xff"] * 20 + [b"warm"] * 5)
    c.execute_command("DEBUG", "CLOCK", "ADVANCE", 1000)
    status, _, body = hs.request("GET", "/v1/stats")
    h = json.loads(body)["hotkeys"]
    assert (h["mode"], h["top_k"], h["sample"]) == ("session", 32, 1)
    assert [(k["name"], k["source"], k["ops"]) for k in h["keys"]] == [
        ("hot\\xff", "bucket", 20.0), ("warm", "bucket", 5.0)]


def test_config_set_top_k_0_turns_tracking_off_and_back_on(c):
    c.config_set("hotkeys-top-k", 0)
    checks(c, [b"k"] * 100)
    assert c.execute_command("HOTKEYS", "GET") is None
    assert c.info()["hotkeys_tracking"] == 0
    c.config_set("hotkeys-top-k", 4)
    c.config_set("hotkeys-sample", 1)
    checks(c, [b"k"] * 100)
    g = get(c)
    assert (g[b"top-k"], g[b"sample-ratio"], g[b"sampled-checks"]) == (4, 1, 100)
    with pytest.raises(redis.ResponseError):
        c.config_set("hotkeys-top-k", 1025)
    with pytest.raises(redis.ResponseError):
        c.config_set("hotkeys-sample", 0)


@pytest.mark.volume
def test_the_tracker_s_memory_does_not_grow_with_distinct_keys(c):
    before = c.info("memory")["hotkeys_tracker_bytes"]
    for batch in range(20):
        checks(c, [b"distinct:%d:%d" % (batch, i) for i in range(5000)])
    assert c.info("memory")["hotkeys_tracker_bytes"] == before
    assert len(by_ops(get(c))) <= 32


def send_checks(sock: socket.socket, payload: bytes, n: int) -> None:
    """Sends n pipelined CL.CHECKs and reads their n replies."""
    sock.sendall(payload)
    seen, tail = 0, b""
    while seen < n:
        data = sock.recv(1 << 20)
        assert data, "connection closed"
        data = tail + data
        seen += data.count(b"*5\r\n")
        tail = data[-3:]
        seen -= tail.count(b"*5\r\n")       # not counted twice with the next read


@pytest.mark.untraced
@pytest.mark.release_only
def test_one_hot_key_among_a_million_cold_ones_is_ranked_first_within_a_second(hs, c):
    """A million checks, 900,000 of them on distinct cold keys and one hot
    key at 10%, pipelined: after the first 100,000 checks, sent and
    answered within a second of the start, and at every point after,
    HOTKEYS GET ranks it first, its count near a tenth of those sampled."""
    def cmd(key: bytes) -> bytes:
        return b"*4\r\n$8\r\nCL.CHECK\r\n$%d\r\n%s\r\n$2\r\n10\r\n$1\r\n1\r\n" % (len(key), key)

    hot = cmd(b"the-hot-one")
    sock = socket.create_connection(("127.0.0.1", hs.port))
    started = time.monotonic()
    cold = 0
    for _ in range(10):                  # 10 rounds of 100,000 checks, 90,000 cold keys new
        parts = []
        for i in range(100_000):
            if i % 10 == 0:
                parts.append(hot)
            else:
                parts.append(cmd(b"cold:%08d" % cold))
                cold += 1
        send_checks(sock, b"".join(parts), 100_000)
        c.execute_command("DEBUG", "CLOCK", "ADVANCE", 100)
        g = get(c)
        top, rate = by_ops(g)[0]
        assert top == b"the-hot-one", by_ops(g)[:4]
        detail = details(g)[0]
        sampled = g[b"sampled-checks"]
        assert 0.07 * sampled <= detail[b"count"] <= 0.13 * sampled
        if cold == 90_000:
            assert time.monotonic() - started < 1.0       # found within a second
    assert cold == 900_000
    assert time.monotonic() - started < 60
    sock.close()


def test_the_envoy_rate_limit_service_s_checks_are_counted_by_their_counters(make_http_server,
                                                                              tmp_path):
    rls = tmp_path / "rls.yaml"
    rls.write_text("domain: web\ndescriptors:\n  - key: path\n"
                   "    rate_limit: {unit: minute, requests_per_unit: 100}\n")
    hs = make_http_server("--manual-clock", "--rls-config", str(rls))
    c = hs.client(protocol=2)
    c.execute_command("HOTKEYS", "START", "METRICS", 1, "OPS", "SAMPLE", 1)
    for _ in range(4):
        status, _, _ = hs.request("POST", "/json", {"domain": "web", "descriptors": [
            {"entries": [{"key": "path", "value": "/orders"}]}]})
        assert status == 200
    (d,) = details(get(c))
    assert (d[b"source"], d[b"count"]) == (b"rule", 4)
    assert b"/orders" in d[b"key"]


def test_the_status_page_in_chromium_shows_the_hot_keys_with_no_console_error(hs, c):
    c.execute_command("HOTKEYS", "START", "METRICS", 1, "OPS", "SAMPLE", 1)
    checks(c, [b"<b>tenant</b>"] * 30 + [b"calm"] * 10)
    c.execute_command("DEBUG", "CLOCK", "ADVANCE", 1000)
    with Chromium() as chromium:
        page = chromium.page()
        for domain in ("Runtime", "Log", "Page"):
            page.call(f"{domain}.enable")
        page.call("Page.navigate", {"url": f"http://127.0.0.1:{hs.extra_port}/"})
        page.wait_for("document.readyState === 'complete'", 10)
        read = """Array.from(document.querySelectorAll('#hot-keys tbody tr[data-key]'))
                  .map((tr) => Array.from(tr.cells).map((td) => td.textContent))"""
        page.wait_for(f"({read}).length === 2", 10)
        rows = page.evaluate(read)
        bold = page.evaluate("document.querySelectorAll('#hot-keys b').length")
        hint = page.evaluate("document.getElementById('hot-hint').textContent")
        problems = console_problems(page.events)
        page.close()
    assert problems == []
    assert [row[:2] for row in rows] == [["<b>tenant</b>", "CL.CHECK"], ["calm", "CL.CHECK"]]
    assert bold == 0                       # a key is text, never markup
    assert hint == "session, 1 check in 1"
