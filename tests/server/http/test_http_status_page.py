"""The status page (GET /) and its snapshot (GET /v1/stats), on a real
server: the JSON over plain HTTP, and the page in Debian's headless
Chromium driven over DevTools (tests/support/cdp.py), which must load without a
console error and show a burst of denials sent over RESP.
"""

from __future__ import annotations

import base64
import json
import os
import re

import pytest
from cdp import Chromium, console_problems
from wire import wait_until

WAIT = 10.0     # seconds: the page polls once a second


def rule(resource: str, capacity: int, mode: str = "enforce") -> str:
    # refill is irrelevant: the manual clock never moves in these tests
    return json.dumps({"match": {"resource": resource}, "capacity": capacity,
                       "refill_per_second": 1, "mode": mode})


def stats(srv, query: str = "") -> dict:
    status, headers, body = srv.request("GET", "/v1/stats" + query)
    assert status == 200, body
    assert headers["content-type"].startswith("application/json")
    return json.loads(body)


def checks(c, client: str, resource: str, n: int) -> list[int]:
    """n CL.LIMIT calls in one pipeline; each one's allowed flag."""
    pipe = c.pipeline(transaction=False)
    for _ in range(n):
        pipe.execute_command("CL.LIMIT", client, resource)
    return [int(reply[0]) for reply in pipe.execute()]


@pytest.fixture
def start(make_http_server):
    """A fastlimit on the manual clock with its HTTP front on."""
    return lambda *args: make_http_server("--manual-clock", *args)


# ---- /v1/stats --------------------------------------------------------------------------------

def test_stats_count_each_rules_decisions_and_list_the_most_denied_first(start):
    server = start()
    c = server.client()
    c.execute_command("CL.RULE", "SET", "burst", rule("api", 5))
    c.execute_command("CL.RULE", "SET", "calm", rule("web", 100))
    c.execute_command("CL.RULE", "SET", "watch", rule("api", 2, mode="shadow"))
    assert checks(c, "alice", "api", 30) == [1] * 5 + [0] * 25
    assert checks(c, "bob", "web", 7) == [1] * 7

    s = stats(server)
    rules = s["rules"]
    # the shadow rule would have denied 28 of the 30 api checks, but the
    # enforced one's 25 denials rank first; then shadow denials; then id
    assert [(r["id"], r["mode"], r["allowed"], r["denied"], r["shadow_denied"])
            for r in rules["top"]] == [("burst", "enforce", 5, 25, 0),
                                       ("watch", "shadow", 2, 0, 28),
                                       ("calm", "enforce", 7, 0, 0)]
    assert rules["totals"] == {"allowed": 14, "denied": 25, "shadow_denied": 28}
    assert (rules["count"], rules["listed"], rules["cap"], rules["truncated"]) == (3, 3, 1000,
                                                                                   False)
    assert s["buckets"] == int(c.info("fastlimit")["buckets"])
    assert s["clients"]["connected"] >= 1
    assert s["clock_ms"] == 0                 # the manual clock, never moved
    assert s["total_commands"] >= 3 + 30 + 7
    limit = next(row for row in s["latency"]["resp"] if row["name"] == "cl.limit")
    assert limit["calls"] == 37 and limit["nsec"] > 0
    assert limit["usec_per_call"] == round(limit["nsec"] / 37 / 1000, 2)
    assert s["replication"]["role"] == "master"
    assert s["replication"]["replicas"] == []
    assert s["memory"]["rss_bytes"] > 0


def test_stats_cap_the_rule_list_and_say_so_while_totals_cover_every_rule(start):
    server = start()
    c = server.client()
    for i in range(5):
        c.execute_command("CL.RULE", "SET", f"r{i}", rule(f"res{i}", 1))
        checks(c, "k", f"res{i}", 1 + i)      # r<i> denies i checks

    rules = stats(server, "?rules=2")["rules"]
    assert [(r["id"], r["denied"]) for r in rules["top"]] == [("r4", 4), ("r3", 3)]
    assert (rules["count"], rules["listed"], rules["cap"], rules["truncated"]) == (5, 2, 2, True)
    assert rules["totals"] == {"allowed": 5, "denied": 10, "shadow_denied": 0}
    assert stats(server, "?rules=0")["rules"]["top"] == []


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.untraced
def test_stats_of_two_thousand_rules_list_a_thousand_within_a_generous_cpu_bound(start,
                                                                                 tmp_path):
    """A snapshot reads every rule's counters (some 2 us each) and lists
    the 1,000 most denied; ten of them take far below the bound."""
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"rules": {f"r{i}": json.loads(rule(f"res{i}", 1))
                                          for i in range(2000)}}))
    server = start("--rules-file", str(path))
    c = server.client()
    checks(c, "k", "res1500", 4)         # 3 denials
    checks(c, "k", "res7", 3)            # 2
    before = cpu_seconds(server.proc.pid)
    for _ in range(10):
        rules = stats(server)["rules"]
    assert cpu_seconds(server.proc.pid) - before < 2.0
    assert (rules["count"], rules["listed"], rules["truncated"]) == (2000, 1000, True)
    assert [(r["id"], r["denied"]) for r in rules["top"][:3]] == [("r1500", 3), ("r7", 2),
                                                                  ("r0", 0)]
    assert rules["top"][-1]["id"] == sorted(f"r{i}" for i in range(2000)
                                            if i not in (7, 1500))[997]
    assert rules["totals"] == {"allowed": 2, "denied": 5, "shadow_denied": 0}


@pytest.mark.parametrize("value", ["-1", "1001", "abc", "+5", " 5", ""])
def test_stats_refuse_a_rule_cap_that_is_not_an_integer_from_0_to_1000(start, value):
    server = start()
    status, headers, body = server.request("GET", "/v1/stats?rules=" + value.replace(" ", "%20"))
    assert status == 400, body
    assert headers["content-type"].startswith("application/problem+json")
    assert json.loads(body)["field"] == "rules"


def test_stats_with_no_rules_are_zeros_and_empty_lists(start):
    server = start()
    rules = stats(server)["rules"]
    assert rules == {"count": 0, "version": rules["version"],
                     "totals": {"allowed": 0, "denied": 0, "shadow_denied": 0},
                     "listed": 0, "cap": 1000, "truncated": False,
                     "order": "denied desc, shadow_denied desc, id", "top": []}


def test_stats_show_the_replication_link_from_both_ends(start):
    primary = start()
    replica = start("--replicaof", "127.0.0.1", str(primary.port))
    wait_until(lambda: stats(replica)["replication"].get("master_link_status") == "up",
               WAIT, "the replica's link")
    r = stats(replica)["replication"]
    assert (r["role"], r["master_host"], r["master_port"]) == ("slave", "127.0.0.1",
                                                               primary.port)
    wait_until(lambda: [f["state"] for f in stats(primary)["replication"]["replicas"]]
               == ["online"], WAIT, "the replica listed online")
    p = stats(primary)["replication"]
    assert p["connected_slaves"] == 1
    [listed] = p["replicas"]
    assert set(listed) == {"ip", "port", "state", "offset", "lag"}
    assert (listed["ip"], listed["state"]) == ("127.0.0.1", "online")
    assert all(isinstance(listed[k], int) for k in ("port", "offset", "lag"))


def shed_checks(c, priority: str, n: int) -> list[int]:
    """n CL.CHECKs of this priority in one pipeline; each one's remaining
    (-2: shed)."""
    pipe = c.pipeline(transaction=False)
    for i in range(n):
        pipe.execute_command("CL.CHECK", f"{priority}{i}", 5, 1, "PRIORITY", priority)
    return [int(reply[2]) for reply in pipe.execute()]


NO_SHEDS = {p: {"allowed": 0, "denied": 0} for p in ("low", "normal", "critical")}


def test_stats_show_the_overload_level_by_name_and_the_shed_checks_by_priority(start):
    server = start("--shed-threshold", "0")      # the level is DEBUG SHED-LEVEL's only
    c = server.client()
    o = stats(server)["overload"]
    assert set(o) == {"level", "level_name", "forced", "busy_percent", "loop_lag_us",
                      "held_input_wait_us", "held_input_bytes", "held_connections", "shed"}
    assert (o["level"], o["level_name"], o["forced"], o["shed"]) == (0, "none", False, NO_SHEDS)
    assert 0 <= o["busy_percent"] <= 100 and o["loop_lag_us"] >= 0
    assert (o["held_input_bytes"], o["held_connections"]) == (0, 0)

    c.execute_command("DEBUG", "SHED-LEVEL", "1")
    assert shed_checks(c, "low", 4) == [-2] * 4
    assert shed_checks(c, "normal", 2) == [4] * 2              # not shed at level 1
    o = stats(server)["overload"]
    assert (o["level"], o["level_name"], o["forced"]) == (1, "low", True)
    assert o["shed"] == {**NO_SHEDS, "low": {"allowed": 4, "denied": 0}}

    c.execute_command("DEBUG", "SHED-LEVEL", "2")
    assert shed_checks(c, "normal", 3) == [-2] * 3
    assert shed_checks(c, "critical", 1) == [4]                # never shed
    o = stats(server)["overload"]
    assert (o["level"], o["level_name"]) == (2, "low+normal")
    assert o["shed"] == {**NO_SHEDS, "low": {"allowed": 4, "denied": 0},
                         "normal": {"allowed": 3, "denied": 0}}
    # measured again: with no threshold the level falls back to none after its hold
    c.execute_command("DEBUG", "SHED-LEVEL", "AUTO")
    wait_until(lambda: stats(server)["overload"]["level_name"] == "none", WAIT,
               "the level to fall")
    assert stats(server)["overload"]["forced"] is False


# ---- GET / -------------------------------------------------------------------------------------

def test_status_page_is_one_self_contained_html_document(start):
    server = start()
    status, headers, body = server.request("GET", "/")
    assert status == 200
    assert headers["content-type"] == "text/html; charset=utf-8"
    # the browser itself refuses anything from elsewhere
    assert "default-src 'none'" in headers["content-security-policy"]
    assert "connect-src 'self'" in headers["content-security-policy"]
    page = body.decode()
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert not re.search(r"<script[^>]+src|<link[^>]+stylesheet|@import", page)


# ---- the page in a browser ----------------------------------------------------------------------

# what the test reads from the DOM, in one evaluation
READ_PAGE = """(() => {
  const q = (s) => document.querySelector(s);
  const rows = [...document.querySelectorAll('#top-denied tbody tr[data-rule]')];
  return {
    state: q('#conn-status').dataset.state,
    points: Number(q('#chart').dataset.points),
    past: Number(q('#chart').dataset.past),
    chart_denied: Number(q('#chart').dataset.denied),
    chart_allowed: Number(q('#chart').dataset.allowed),
    denied_total: q('#denied-total').textContent,
    rows: rows.map((tr) => [tr.dataset.rule, Number(tr.dataset.denied)]),
    rule_series: JSON.parse(q('#rule-chart').dataset.series).map((s) => [s.id, s.denied]),
    buckets: q('#buckets').textContent,
    role: q('#repl-role').textContent,
    empty_table: !!q('#top-denied tbody td.empty'),
  };
})()"""


def open_page(chromium: Chromium, url: str):
    page = chromium.page()
    for domain in ("Runtime", "Log", "Page"):
        page.call(f"{domain}.enable")
    page.call("Page.navigate", {"url": url})
    page.wait_for("document.readyState === 'complete'", WAIT)
    return page


def test_status_page_with_no_rules_loads_in_chromium_without_a_console_error(start):
    server = start()
    with Chromium() as chromium:
        page = open_page(chromium, f"http://127.0.0.1:{server.http_port}/")
        page.wait_for(f"({READ_PAGE}).points >= 2", WAIT)
        seen = page.evaluate(READ_PAGE)
        assert console_problems(page.events) == []
        page.close()
    assert (seen["state"], seen["rows"], seen["empty_table"]) == ("live", [], True)
    assert (seen["chart_denied"], seen["rule_series"], seen["role"]) == (0, [], "primary")


def test_status_page_in_chromium_shows_a_burst_of_denials_with_no_console_error(start, tmp_path):
    server = start()
    c = server.client()
    c.execute_command("CL.RULE", "SET", "burst", rule("api", 5))
    c.execute_command("CL.RULE", "SET", "calm", rule("web", 100))
    checks(c, "bob", "web", 3)
    with Chromium() as chromium:
        page = open_page(chromium, f"http://127.0.0.1:{server.http_port}/")
        # two snapshots make the first point; none of them saw a denial
        page.wait_for(f"({READ_PAGE}).points >= 1", WAIT)
        before = page.evaluate(READ_PAGE)
        assert (before["state"], before["chart_denied"], before["denied_total"]) == ("live", 0,
                                                                                     "0")

        assert checks(c, "alice", "api", 30) == [1] * 5 + [0] * 25
        page.wait_for(f"""(() => {{ const p = {READ_PAGE};
            return p.rows.length && p.rows[0][0] === 'burst' && p.rows[0][1] === 25
                   && p.chart_denied === 25; }})()""", WAIT)
        seen = page.evaluate(READ_PAGE)
        shot = page.screenshot(str(tmp_path / "status-page.png"))
        # a rule picked in the table gets a chart of its own decisions
        page.evaluate("document.querySelector('#top-denied tr[data-rule=\"burst\"]').click()")
        picked = page.evaluate("""(() => { const c = document.querySelector('#rule-chart');
            return [c.dataset.selected, JSON.parse(c.dataset.series)]; })()""")
        problems = console_problems(page.events)
        page.close()
    print(f"status page screenshot: {shot}")
    assert problems == []
    assert seen["rows"] == [["burst", 25], ["calm", 0]]
    assert seen["rule_series"] == [["burst", 25]]
    # bob's 3 allowed checks are in the chart too when the server's history
    # (shown from before the page opened) sampled the totals before them
    assert seen["denied_total"] == "25"
    assert before["chart_allowed"] in (0, 3)
    assert seen["chart_allowed"] == before["chart_allowed"] + 5
    assert seen["buckets"] == str(int(c.info("fastlimit")["buckets"]))
    assert picked == ["burst", [{"id": "burst", "allowed": 5, "denied": 25, "shadow_denied": 0}]]
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_status_page_behind_requirepass_polls_with_the_credentials_it_was_opened_with(start):
    server = start("--requirepass", "s3cret")
    assert server.request("GET", "/v1/stats")[0] == 401
    token = base64.b64encode(b"ops:s3cret").decode()
    assert server.request("GET", "/v1/stats", headers={"Authorization": f"Basic {token}"})[0] == 200
    with Chromium() as chromium:
        # the browser answers the 401's Basic challenge with the URL's
        # user and password, and sends them again with the page's fetches
        page = open_page(chromium, f"http://ops:s3cret@127.0.0.1:{server.http_port}/")
        page.wait_for(f"({READ_PAGE}).points >= 2", WAIT)
        assert page.evaluate(READ_PAGE)["state"] == "live"
        assert console_problems(page.events) == []
        page.close()


def test_rules_named_like_object_properties_appear_in_the_chart_and_legend(start):
    """Rule ids are any string: __proto__, constructor and toString are
    charted as every other (kept in a Map, not in a plain object whose
    prototype they would name)."""
    server = start()
    c = server.client()
    ids = ["__proto__", "constructor", "toString", "normal"]
    for i, rule_id in enumerate(ids):
        c.execute_command("CL.RULE", "SET", rule_id, rule(f"res{i}", 5))
    with Chromium() as chromium:
        page = open_page(chromium, f"http://127.0.0.1:{server.http_port}/")
        page.wait_for(f"({READ_PAGE}).points >= 1", WAIT)
        for i in range(len(ids)):
            checks(c, "x", f"res{i}", 10)             # 5 allowed, 5 denied each
        page.wait_for(f"({READ_PAGE}).chart_denied === 20", WAIT)
        page.wait_for(f"({READ_PAGE}).rule_series.length === 4", WAIT)
        seen = page.evaluate(READ_PAGE)
        legend = page.evaluate("[...document.querySelectorAll('#rule-legend span[data-rule]')]"
                               ".map((s) => s.dataset.rule)")
        problems = console_problems(page.events)
        page.close()
    assert problems == []
    assert sorted(seen["rule_series"]) == sorted([rule_id, 5] for rule_id in ids)
    assert sorted(legend) == sorted(ids)


READ_OVERLOAD = """(() => {
  const dl = document.querySelector('#overload');
  return {
    level: dl.dataset.level, forced: dl.dataset.forced,
    name: document.querySelector('#shed-level').textContent,
    hint: document.querySelector('#overload-hint').textContent,
    busy: document.querySelector('#loop-busy').textContent,
    lag: document.querySelector('#loop-lag').textContent,
    fields: [...dl.querySelectorAll('dt')].map((dt) => dt.textContent),
    elements: dl.querySelectorAll('*').length,
    rows: [...document.querySelectorAll('#shed-counts tbody tr[data-priority]')]
      .map((tr) => [...tr.cells].map((td) => td.textContent)),
  };
})()"""


def test_status_page_in_chromium_shows_the_overload_level_and_shed_counts(start):
    """The Overload block: the level by name (what it sheds), busy, loop
    lag, and the shed checks by priority, as text; it follows the level."""
    server = start("--shed-threshold", "0")
    c = server.client()
    c.execute_command("DEBUG", "SHED-LEVEL", "2")
    assert shed_checks(c, "low", 5) == [-2] * 5
    assert shed_checks(c, "normal", 2) == [-2] * 2
    with Chromium() as chromium:
        page = open_page(chromium, f"http://127.0.0.1:{server.http_port}/")
        page.wait_for(f"({READ_OVERLOAD}).name === 'low+normal'", WAIT)
        shedding = page.evaluate(READ_OVERLOAD)
        c.execute_command("DEBUG", "SHED-LEVEL", "0")
        page.wait_for(f"({READ_OVERLOAD}).name === 'none'", WAIT)
        calm = page.evaluate(READ_OVERLOAD)
        problems = console_problems(page.events)
        page.close()
    assert problems == []
    assert (shedding["level"], shedding["forced"]) == ("2", "true")
    assert shedding["hint"] == "level held by DEBUG SHED-LEVEL"
    assert shedding["fields"] == ["shedding", "loop busy", "loop lag", "held-back input"]
    assert shedding["elements"] == 8              # the dt and dd: the texts are no markup
    assert re.fullmatch(r"\d{1,3}%", shedding["busy"]), shedding["busy"]
    assert re.fullmatch(r"[\d,]+ \u00b5s|\d+\.\d ms", shedding["lag"]), shedding["lag"]
    assert shedding["rows"] == [["low", "5", "0"], ["normal", "2", "0"], ["critical", "0", "0"]]
    assert (calm["level"], calm["rows"]) == ("0", shedding["rows"])


# ---- history: what happened before the page was opened ---------------------------------------

def history_rows(server, since: int = 0) -> list[list[int]]:
    h = stats(server, f"?since={since}")["history"]
    assert h["fields"] == ["time_ms", "commands", "allowed", "denied", "shadow_denied"]
    return h["seconds"]


def test_stats_since_serve_the_servers_samples_of_its_totals(start):
    server = start()
    c = server.client()
    c.execute_command("CL.RULE", "SET", "burst", rule("api", 5))
    assert "history" not in stats(server)                 # only when asked
    wait_until(lambda: history_rows(server), WAIT, "a first sample")
    assert checks(c, "alice", "api", 8) == [1] * 5 + [0] * 3
    rows = wait_until(lambda: [r for r in history_rows(server) if r[3] == 3], WAIT,
                      "a sample after the denials")
    first = history_rows(server)[0]
    assert first[2:] in ([0, 0, 0], [5, 3, 0])
    assert rows[-1][2:] == [5, 3, 0]
    every = history_rows(server)
    assert [r[0] for r in every] == sorted(r[0] for r in every)      # oldest first, one a second
    assert all(b[0] - a[0] >= 900 for a, b in zip(every, every[1:], strict=False))
    # only what came after the time given; a sample may land meanwhile
    assert all(r[0] > every[-1][0] for r in history_rows(server, every[-1][0]))
    assert history_rows(server, every[0][0])[:len(every) - 1] == every[1:]
    minutes = stats(server, "?since=0")["history"]["minutes"]
    assert 1 <= len(minutes) <= 2 and minutes[0] == every[0]
    # fixed in size whatever happens: 600 seconds and 1,440 minutes of 5 numbers
    assert c.info("memory")["status_history_bytes"] == (600 + 1440) * 5 * 8
    for bad in ("-1", "x", "1.5", ""):
        status, _, body = server.request("GET", f"/v1/stats?since={bad}")
        assert status == 400 and b"since" in body, (bad, body)


def test_status_page_in_chromium_shows_denials_from_before_it_was_opened(start):
    server = start()
    c = server.client()
    c.execute_command("CL.RULE", "SET", "burst", rule("api", 5))
    wait_until(lambda: history_rows(server), WAIT, "a first sample")
    assert checks(c, "alice", "api", 30) == [1] * 5 + [0] * 25
    wait_until(lambda: [r for r in history_rows(server) if r[3] == 25], WAIT,
               "a sample after the denials")
    with Chromium() as chromium:
        page = open_page(chromium, f"http://127.0.0.1:{server.http_port}/")
        # no poll can show them (they happened before its first one): the
        # server's samples do, as soon as the page has loaded them
        page.wait_for(f"({READ_PAGE}).past >= 1", WAIT)
        seen = page.evaluate(READ_PAGE)
        problems = console_problems(page.events)
        page.close()
    assert problems == []
    assert (seen["chart_denied"], seen["chart_allowed"]) == (25, 5), seen
    assert seen["denied_total"] == "25"
