"""The rules API over real HTTP (http.client) against real servers: PUT,
GET, DELETE of /v1/rules/{id} (and the design's /rules/{id}) and GET
/v1/rules, with exact statuses, headers and bodies; conditional requests
(ETag, If-Match, If-None-Match) including two writers racing; the same
documents, validation and durability as CL.RULE over RESP, each way
round; a replica refusing changes; requirepass; and bad input.  In
cluster mode: tests/cluster/test_http_rules_cluster.py."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import signal
import threading

import pytest
import redis
from http_calls import http_examples, run_examples
from http_rules import RULE, Node, Reply, pipelined
from wire import free_port, wait_until

CANONICAL = ('{"match":{"resource":"GET /x"},"algorithm":"token_bucket","capacity":2,'
             '"refill_per_second":1,"mode":"enforce","on_failure":"open","key":"client"}')


def etag_of(document: bytes) -> str:
    """The tag the API promises: a hash of the exact canonical document."""
    return '"' + hashlib.sha256(document).hexdigest()[:32] + '"'


@pytest.fixture
def start(make_server, rules_store):
    """start(*args) -> a manual-clock Node with an HTTP port of its own,
    on each rules store (the SQLite rules-db, and a PostgreSQL table that
    every node of the test shares)."""
    def run(*args) -> Node:
        port = free_port()
        return Node(make_server("--manual-clock", "--http-port", str(port), *rules_store, *args),
                    port)
    return run


@pytest.fixture
def node(start) -> Node:
    return start()


# ---- create, read, replace, delete -----------------------------------------------------

def test_put_creates_with_201_and_location_then_replaces_with_200(node):
    created = node("PUT", "/v1/rules/orders", RULE)
    assert created.status == 201
    assert created.body == CANONICAL.encode()
    assert created.headers["content-type"] == "application/json"
    assert created.headers["location"] == "/v1/rules/orders"
    assert created.headers["etag"] == etag_of(CANONICAL.encode())

    got = node("GET", "/v1/rules/orders")
    assert (got.status, got.body, got.headers["etag"]) == (200, created.body,
                                                          created.headers["etag"])

    replaced = node("PUT", "/v1/rules/orders", {**RULE, "capacity": 5})
    assert replaced.status == 200
    assert "location" not in replaced.headers
    assert replaced.json()["capacity"] == 5
    assert replaced.headers["etag"] == etag_of(replaced.body) != created.headers["etag"]

    # PUT is idempotent: the same document again changes nothing, tag included.
    again = node("PUT", "/v1/rules/orders", {**RULE, "capacity": 5})
    assert (again.status, again.body, again.headers["etag"]) == (200, replaced.body,
                                                                replaced.headers["etag"])


def test_delete_is_204_then_404(node):
    node("PUT", "/v1/rules/orders", RULE)
    deleted = node("DELETE", "/v1/rules/orders")
    assert (deleted.status, deleted.body) == (204, b"")
    for method in ("DELETE", "GET"):
        missing = node(method, "/v1/rules/orders")
        assert missing.status == 404
        assert missing.problem() == {"type": "urn:fastlimit:problem:no-such-rule",
                                     "title": "no such rule", "status": 404,
                                     "detail": "no rule 'orders'"}
    assert node.resp("CL.RULE", "GET", "orders") is None


def test_the_designs_paths_are_the_same_resources(node):
    created = node("PUT", "/rules/orders", RULE)
    assert (created.status, created.headers["location"]) == (201, "/v1/rules/orders")
    got = node("GET", "/v1/rules/orders")
    assert got.headers["etag"] == created.headers["etag"]
    assert node("GET", "/rules/orders").body == got.body
    assert node("GET", "/rules").body == node("GET", "/v1/rules").body
    assert node("DELETE", "/rules/orders").status == 204
    assert node("GET", "/v1/rules/orders").status == 404


def test_the_body_is_read_as_json_whatever_its_content_type(node):
    # curl -d sends application/x-www-form-urlencoded unless told otherwise.
    for i, content_type in enumerate(("application/x-www-form-urlencoded", "text/plain",
                                      "application/json; charset=utf-8")):
        reply = node("PUT", f"/v1/rules/r{i}", RULE, {"Content-Type": content_type})
        assert (reply.status, reply.body) == (201, CANONICAL.encode())


# ---- the rule set ------------------------------------------------------------------------

def test_the_listing_holds_every_rule_and_a_tag_that_changes_with_any_change(node):
    empty = node("GET", "/v1/rules")
    assert empty.status == 200
    assert empty.json() == {"etag": empty.headers["etag"], "rules": []}
    a = node("PUT", "/v1/rules/a", RULE)
    node("PUT", "/v1/rules/b", {**RULE, "mode": "shadow"})
    listing = node("GET", "/v1/rules")
    doc = listing.json()
    assert doc["etag"] == listing.headers["etag"] != empty.headers["etag"]
    assert [r["id"] for r in doc["rules"]] == ["a", "b"]
    first = doc["rules"][0]
    assert first["etag"] == a.headers["etag"]
    assert json.dumps(first["rule"], separators=(",", ":")) == CANONICAL
    assert first["source"] == "command"
    assert doc["rules"][1]["rule"]["mode"] == "shadow"

    unchanged = node("GET", "/v1/rules", headers={"If-None-Match": listing.headers["etag"]})
    assert (unchanged.status, unchanged.body) == (304, b"")
    assert unchanged.headers["etag"] == listing.headers["etag"]

    tags = {listing.headers["etag"]}
    for change in (lambda: node("PUT", "/v1/rules/a", {**RULE, "capacity": 3}),
                   lambda: node.resp("CL.RULE", "SET", "c", json.dumps(RULE)),
                   lambda: node("DELETE", "/v1/rules/b")):
        change()
        tag = node("GET", "/v1/rules").headers["etag"]
        assert tag not in tags
        tags.add(tag)
    assert node("GET", "/v1/rules", headers={"If-None-Match": listing.headers["etag"]}
                ).status == 200


# ---- conditional requests ----------------------------------------------------------------

def test_get_answers_a_matching_if_none_match_with_304(node):
    tag = node("PUT", "/v1/rules/orders", RULE).headers["etag"]
    for value in (tag, f"W/{tag}", f'"other", {tag}', "*"):
        reply = node("GET", "/v1/rules/orders", headers={"If-None-Match": value})
        assert (reply.status, reply.body, reply.headers["etag"]) == (304, b"", tag), value
    fresh = node("GET", "/v1/rules/orders", headers={"If-None-Match": '"other"'})
    assert (fresh.status, fresh.body) == (200, CANONICAL.encode())
    head = node("HEAD", "/v1/rules/orders")
    assert (head.status, head.body, head.headers["etag"]) == (200, b"", tag)
    assert node("HEAD", "/v1/rules/orders", headers={"If-None-Match": tag}).status == 304
    missing = node("GET", "/v1/rules/nope", headers={"If-None-Match": "*"})
    assert missing.status == 404


def test_if_match_refuses_a_stale_put_or_delete_with_412(node):
    old = node("PUT", "/v1/rules/orders", RULE).headers["etag"]
    new = node("PUT", "/v1/rules/orders", {**RULE, "capacity": 3}).headers["etag"]
    for method, body in (("PUT", {**RULE, "capacity": 9}), ("DELETE", None)):
        stale = node(method, "/v1/rules/orders", body, {"If-Match": old})
        assert stale.status == 412
        assert stale.headers["etag"] == new
        assert stale.problem() == {"type": "urn:fastlimit:problem:precondition-failed",
                                   "title": "precondition failed", "status": 412,
                                   "detail": f"the current ETag is {new}"}
        # A weak tag never matches If-Match (strong comparison), nor does garble.
        for value in (f"W/{new}", "garbage", new.strip('"')):
            assert node(method, "/v1/rules/orders", body, {"If-Match": value}).status == 412
    assert node("GET", "/v1/rules/orders").json()["capacity"] == 3

    fresh = node("PUT", "/v1/rules/orders", {**RULE, "capacity": 4},
                 {"If-Match": f'"nope", {new}'})
    assert fresh.status == 200
    assert node("DELETE", "/v1/rules/orders",
                headers={"If-Match": fresh.headers["etag"]}).status == 204


def test_if_match_on_a_rule_that_does_not_exist_is_412(node):
    for value in ("*", '"anything"'):
        for method, body in (("PUT", RULE), ("DELETE", None)):
            reply = node(method, "/v1/rules/orders", body, {"If-Match": value})
            assert reply.status == 412
            assert "etag" not in reply.headers
            assert reply.problem()["detail"] == "there is no such rule"
    assert node.resp("CL.RULE", "GET", "orders") is None
    node("PUT", "/v1/rules/orders", RULE)
    assert node("PUT", "/v1/rules/orders", {**RULE, "capacity": 7},
                {"If-Match": "*"}).status == 200


def test_if_none_match_star_makes_put_create_only(node):
    assert node("PUT", "/v1/rules/orders", RULE, {"If-None-Match": "*"}).status == 201
    refused = node("PUT", "/v1/rules/orders", {**RULE, "capacity": 9}, {"If-None-Match": "*"})
    assert refused.status == 412
    assert refused.headers["etag"] == etag_of(CANONICAL.encode())
    assert node("GET", "/v1/rules/orders").body == CANONICAL.encode()


def race(port: int, tag: str, capacities: tuple[int, int]) -> dict[int, Reply]:
    """Two writers, each on its own connection, PUT a document with the
    same If-Match at the same moment; their replies by capacity."""
    barrier = threading.Barrier(2)
    replies: dict[int, Reply] = {}

    def write(capacity: int):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        conn.connect()          # both connected before either sends
        barrier.wait()
        conn.request("PUT", "/v1/rules/orders", json.dumps({**RULE, "capacity": capacity}),
                     {"If-Match": tag})
        resp = conn.getresponse()
        replies[capacity] = Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()},
                                  resp.read())
        conn.close()
    writers = [threading.Thread(target=write, args=(c,)) for c in capacities]
    for w in writers:
        w.start()
    for w in writers:
        w.join(30)
    return replies


def test_of_two_writers_with_the_same_etag_exactly_one_wins(node):
    node("PUT", "/v1/rules/orders", RULE)
    for round_ in range(10):
        tag = node("GET", "/v1/rules/orders").headers["etag"]
        replies = race(node.port, tag, (10 + 2 * round_, 11 + 2 * round_))
        assert sorted(r.status for r in replies.values()) == [200, 412]
        (winner, won), = [(c, r) for c, r in replies.items() if r.status == 200]
        lost = next(r for r in replies.values() if r.status == 412)
        assert lost.headers["etag"] == won.headers["etag"]
        assert json.loads(node.resp("CL.RULE", "GET", "orders"))["capacity"] == winner
        assert node("GET", "/v1/rules/orders").headers["etag"] == won.headers["etag"]


def test_pipelined_rule_requests_are_answered_in_order(node):
    body = json.dumps(RULE).encode()
    replies = pipelined(node.port, ("PUT", "/v1/rules/orders", body),
                        ("GET", "/v1/rules/orders", b""), ("DELETE", "/v1/rules/orders", b""),
                        ("GET", "/v1/rules/orders", b""), ("PUT", "/v1/rules/orders", body))
    assert [r.status for r in replies] == [201, 200, 204, 404, 201]
    assert replies[1].body == CANONICAL.encode()


# ---- the same rules as CL.RULE ---------------------------------------------------------------

def test_a_rule_put_over_http_is_in_force_over_resp(node):
    node.resp("DEBUG", "CLOCK", "SET", 0)
    put = node("PUT", "/v1/rules/orders", RULE)
    assert node.resp("CL.RULE", "GET", "orders") == put.body
    assert node.resp("CL.RULE", "LIST") == [b"orders"]
    decisions = [node.resp("CL.LIMIT", "u", "GET /x")[0] for _ in range(3)]
    assert decisions == [1, 1, 0]         # capacity 2
    node("DELETE", "/v1/rules/orders")
    assert node.resp("CL.RULE", "LIST") == []
    assert node.resp("CL.LIMIT", "u", "GET /x")[0] == 1     # no rule: nothing denies


def test_a_rule_set_over_resp_changes_the_http_get_and_its_etag(node):
    node.resp("CL.RULE", "SET", "orders", json.dumps(RULE))
    first = node("GET", "/v1/rules/orders")
    assert (first.status, first.body) == (200, CANONICAL.encode())
    node.resp("CL.RULE", "SET", "orders", json.dumps({**RULE, "mode": "shadow"}))
    second = node("GET", "/v1/rules/orders")
    assert second.json()["mode"] == "shadow"
    assert second.headers["etag"] != first.headers["etag"]
    # A writer holding the tag from before the RESP change is refused.
    assert node("PUT", "/v1/rules/orders", RULE, {"If-Match": first.headers["etag"]}
                ).status == 412
    node.resp("CL.RULE", "DEL", "orders")
    assert node("GET", "/v1/rules/orders").status == 404


def test_two_changes_within_one_millisecond_give_two_tags(node):
    # The clock is manual and stands still: only the content can tell them apart.
    node.resp("DEBUG", "CLOCK", "SET", 5)
    tags = [node("PUT", "/v1/rules/orders", {**RULE, "capacity": c}).headers["etag"]
            for c in (2, 3, 2)]
    assert tags[0] != tags[1]
    assert tags[2] == tags[0]      # the same document is the same representation


def test_a_put_survives_a_restart_with_a_rules_db(make_server, tmp_path):
    db = str(tmp_path / "rules.db")
    port = free_port()
    first = Node(make_server("--manual-clock", "--http-port", str(port), "--rules-db", db),
                 port)
    put = first("PUT", "/v1/rules/orders", RULE)
    listing = first("GET", "/v1/rules")
    first.process.stop()
    port = free_port()
    again = Node(make_server("--manual-clock", "--http-port", str(port), "--rules-db", db),
                 port)
    got = again("GET", "/v1/rules/orders")
    assert (got.status, got.body, got.headers["etag"]) == (200, put.body, put.headers["etag"])
    assert again("GET", "/v1/rules").headers["etag"] == listing.headers["etag"]
    assert again.resp("CL.RULE", "GET", "orders") == put.body


def test_a_put_is_durable_once_acknowledged(make_server, tmp_path):
    db = str(tmp_path / "rules.db")
    port = free_port()
    first = Node(make_server("--manual-clock", "--http-port", str(port), "--rules-db", db),
                 port)
    assert first("PUT", "/v1/rules/orders", RULE).status == 201
    first.process.proc.send_signal(signal.SIGKILL)
    first.process.proc.wait(10)
    port = free_port()
    again = Node(make_server("--manual-clock", "--http-port", str(port), "--rules-db", db),
                 port)
    assert again("GET", "/v1/rules/orders").body == CANONICAL.encode()


# ---- errors --------------------------------------------------------------------------------

def resp_error(node: Node, *args) -> str:
    with pytest.raises(redis.ResponseError) as e:
        node.resp(*args)
    return str(e.value)


@pytest.mark.parametrize("doc, field", [
    ({"capacity": "2", "refill_per_second": 1}, "capacity"),
    ({"capacity": 2.0, "refill_per_second": 1}, "capacity"),
    ({"capacity": True, "refill_per_second": 1}, "capacity"),
    ({"capacity": 0, "refill_per_second": 1}, "capacity"),
    ({"capacity": 2}, "refill_per_second"),
    ({**RULE, "colour": "blue"}, "colour"),
    ({**RULE, "limit": 5}, "limit"),
    ({**RULE, "match": {"tier": 3}}, "match.tier"),
    ({**RULE, "match": {"path": "/"}}, "match.path"),
    ({**RULE, "match": []}, "match"),
    ({**RULE, "algorithm": "leaky"}, "algorithm"),
    ({**RULE, "mode": None}, "mode"),
    ([RULE], None),
    ("a string", None),
    (42, None),
])
def test_an_invalid_rule_is_a_422_problem_naming_the_field_as_cl_rule_set_does(node, doc, field):
    reply = node("PUT", "/v1/rules/orders", json.dumps(doc))
    assert reply.status == 422
    problem = reply.problem()
    expected = {"type": "urn:fastlimit:problem:invalid-rule", "status": 422,
                "title": "invalid rule", "code": "ERR",
                "detail": resp_error(node, "CL.RULE", "SET", "orders", json.dumps(doc))}
    if field is not None:
        expected["field"] = field
    assert problem == expected
    assert node("GET", "/v1/rules/orders").status == 404


@pytest.mark.parametrize("body, detail", [
    (b"", "not valid JSON: Expecting value: line 1 column 1 (char 0)"),
    (b'{"capacity": 2,', "not valid JSON: "),
    (b'{"capacity": 2, "capacity": 3, "refill_per_second": 1}',
     "not valid JSON: duplicate key 'capacity'"),
    (b'{"capacity": NaN, "refill_per_second": 1}', "not valid JSON: NaN is not allowed"),
    (b'{"capacity": 2, "refill_per_second": 1, "x": "\xff"}', "not valid UTF-8"),
    (b"[" * 100_000, "document longer than 65536 bytes"),
])
def test_a_body_that_is_not_a_json_document_is_a_400_problem(node, body, detail):
    reply = node("PUT", "/v1/rules/orders", body)
    assert reply.status == 400
    problem = reply.problem()
    assert problem["title"] == "malformed rule document"
    assert problem["code"] == "ERR"
    assert "field" not in problem
    assert problem["detail"].startswith(f"invalid rule 'orders': {detail}")
    assert problem["detail"] == resp_error(node, "CL.RULE", "SET", "orders", body)
    assert node("GET", "/v1/rules/orders").status == 404


@pytest.mark.parametrize("path, shown", [
    ("/v1/rules/bad%20id", "bad id"),
    ("/v1/rules/%FF", "\\ufffd"),
    ("/v1/rules/semi%3Bcolon", "semi;colon"),
    ("/v1/rules/" + "a" * 129, "a" * 64 + "..."),
])
def test_an_id_no_rule_may_have_is_refused_by_put_and_not_found_by_get(node, path, shown):
    reply = node("PUT", path, RULE)
    assert reply.status == 400
    assert reply.problem() == {
        "type": "urn:fastlimit:problem:invalid-rule-id", "title": "invalid rule id",
        "status": 400, "code": "ERR",
        "detail": f"invalid rule id '{shown}': must be 1 to 128 characters of "
                  "A-Z a-z 0-9 _ . : / -"}
    assert node("GET", path).status == 404
    assert node("DELETE", path).status == 404
    assert node.resp("CL.RULE", "LIST") == []


def test_a_percent_encoded_id_is_the_rule_of_the_decoded_id(node):
    created = node("PUT", "/v1/rules/api%3Aorders%2Ev1", RULE)
    assert created.status == 201
    assert created.headers["location"] == "/v1/rules/api:orders.v1"
    assert node.resp("CL.RULE", "GET", "api:orders.v1") == created.body
    assert node("GET", "/v1/rules/api:orders.v1").headers["etag"] == created.headers["etag"]


def test_an_id_with_a_slash_is_reached_with_it_percent_encoded(node):
    created = node("PUT", "/v1/rules/api%2Forders", RULE)
    assert created.status == 201
    assert created.headers["location"] == "/v1/rules/api%2Forders"
    assert node.resp("CL.RULE", "LIST") == [b"api/orders"]
    assert node("GET", created.headers["location"]).body == CANONICAL.encode()
    # A literal "/" ends the id's path segment: that is no endpoint.
    assert node("GET", "/v1/rules/api/orders").status == 404
    assert node("DELETE", "/v1/rules/api%2forders").status == 204


def test_with_requirepass_every_rules_call_needs_the_password(start):
    node = start("--requirepass", "s3cret")
    for method, path, body in (("PUT", "/v1/rules/orders", RULE),
                               ("GET", "/v1/rules/orders", None), ("GET", "/v1/rules", None),
                               ("DELETE", "/v1/rules/orders", None),
                               ("PUT", "/rules/orders", RULE)):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            assert node(method, path, body, headers).status == 401
    with node.process.client(password="s3cret") as c:
        assert c.execute_command("CL.RULE", "LIST") == []
    bearer = {"Authorization": "Bearer s3cret"}
    basic = {"Authorization": "Basic " + base64.b64encode(b"ops:s3cret").decode()}
    assert node("PUT", "/v1/rules/orders", RULE, bearer).status == 201
    assert node("GET", "/v1/rules/orders", headers=basic).body == CANONICAL.encode()


# ---- replicas -------------------------------------------------------------------

def test_a_replica_serves_its_primarys_rules_and_refuses_changes_with_503(start):
    primary = start()
    replica = start("--replicaof", "127.0.0.1", str(primary.process.port))
    wait_until(lambda: replica.resp("INFO", "replication")["master_link_status"] == "up")
    put = primary("PUT", "/v1/rules/orders", RULE)
    wait_until(lambda: replica("GET", "/v1/rules/orders").status == 200)
    assert replica("GET", "/v1/rules/orders").headers["etag"] == put.headers["etag"]
    for method, body in (("PUT", {**RULE, "capacity": 9}), ("DELETE", None)):
        refused = replica(method, "/v1/rules/orders", body)
        assert refused.status == 503
        problem = refused.problem()
        assert (problem["code"], problem["detail"]) == (
            "READONLY", "You can't write against a read only replica.")
    assert replica("GET", "/v1/rules/orders").body == put.body


def test_the_readmes_rules_examples_answer_as_shown(hs):
    examples = http_examples("### Rules over HTTP")
    assert len(examples) == 6
    run_examples(hs, examples)

