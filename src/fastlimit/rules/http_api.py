"""The rules API over HTTP: the same rule documents, validation and
durability as CL.RULE SET/GET/DEL (both call fastlimit.rules.RuleRegistry
the same way), with HTTP's conditional requests for safe concurrent edits.

    PUT    /v1/rules/{id}   create (201, Location) or replace (200) a rule
                            from its JSON document; the reply is the
                            canonical document
    GET    /v1/rules/{id}   the canonical document (CL.RULE GET), or 404
    DELETE /v1/rules/{id}   204, or 404 if there is no such rule
    GET    /v1/rules        {"etag", "rules": [{id, etag, source, rule},
                            ...]}, sorted by id

Each also answers at the design's /rules/... paths.

ETags are strong and content hashes: a rule's is the hash of its
canonical document (the exact body GET returns), so it changes with
every change of the rule however close two changes come, and equal
documents, also after a restart, have equal tags.  The rule set's is the
hash of the listing, which holds nothing but the rules (no times), so it
too is the same after a restart with the same rules.  ``If-Match`` on PUT and DELETE refuses a stale
edit with 412 (``*`` needs the rule to exist), ``If-None-Match: *`` makes
a PUT create-only, and GET answers ``If-None-Match`` with 304.  In
cluster mode the precondition is checked and the change made inside
Cluster.rule_change, after the newest rule set of the other primaries
has been taken, so a stale edit is refused cluster-wide as it is here.

Errors are problem documents (RFC 9457): an id no rule may have, or a
body that is not JSON text, is 400, a document CL.RULE SET would refuse is 422 with the
field it names (``field``) and CL.RULE's message (``detail``), and
``code`` carries the RESP error code where RESP has one.  The body is
read as JSON whatever its Content-Type, so ``curl -d`` (which says
application/x-www-form-urlencoded) works as it is written.
"""

from __future__ import annotations

import hashlib
import json
import re
from urllib.parse import quote

from fastlimit._protocol import READONLY_ERROR
from fastlimit._resp import ReplyError
from fastlimit.rules.model import DocumentError, RuleError, check_rule_id, parse_rule, show
from fastlimit.rules.postgres import Conflict, Write
from fastlimit.rules.registry import SOURCE_COMMAND, Entry
from fastlimit.rules.store import StoreError
from fastlimit.server.http.routes import Request, Response, problem

CANONICAL_PREFIX = "/v1/rules/"
ENTITY_TAG = re.compile(r'\s*(W/)?("[^"]*")\s*(?:,|$)')


# ---- entity tags --------------------------------------------------------------------

def _tag(digest: str) -> str:
    # 128 bits of SHA-256: a collision between two versions of one rule
    # is not a practical concern, and the tag stays short.
    return '"' + digest[:32] + '"'


def rule_etag(entry: Entry) -> str:
    return _tag(entry.rule.digest)


def _etag(entry: Entry | None) -> str | None:
    return rule_etag(entry) if entry is not None else None


def _tags_match(header: str, etag: str | None, *, weak: bool) -> bool:
    """Whether an If-Match (strong comparison) or If-None-Match (weak)
    field value matches the current tag; nothing matches a rule that does
    not exist.  A value that is not a list of entity tags matches nothing:
    a PUT with a garbled If-Match is refused, not applied."""
    if etag is None:
        return False
    if header.strip() == "*":
        return True
    for m in ENTITY_TAG.finditer(header):
        if m.group(2) == etag and (weak or not m.group(1)):
            return True
    return False


def _precondition(req: Request, etag: str | None) -> int | None:
    """RFC 9110 §13.2.2's evaluation: 412 when If-Match fails; when
    If-None-Match matches, 304 for GET and 412 otherwise; else None."""
    if_match = req.headers.get("if-match")
    if if_match is not None and not _tags_match(if_match, etag, weak=False):
        return 412
    if_none_match = req.headers.get("if-none-match")
    if if_none_match is not None and _tags_match(if_none_match, etag, weak=True):
        return 304 if req.method in ("GET", "HEAD") else 412
    return None


def _refusal(req: Request, etag: str | None) -> Response | None:
    """The 304 or 412 the request's preconditions call for, if any,
    given the current tag (None: no such rule)."""
    status = _precondition(req, etag)
    if status is None:
        return None
    headers = [("ETag", etag)] if etag is not None else []
    if status == 304:
        return Response(304, headers=headers)
    detail = "there is no such rule" if etag is None else f"the current ETag is {etag}"
    return problem(412, "precondition failed", detail, headers=headers)


# ---- replies ---------------------------------------------------------------------

def location(rule_id: str) -> str:
    """The rule's canonical URL path; an id's "/" is percent-encoded, as
    a request must send it (a literal one would end the {id} segment)."""
    return CANONICAL_PREFIX + quote(rule_id, safe=":")


def _rule_response(status: int, entry: Entry, headers=()) -> Response:
    return Response(status, entry.rule.document,
                    headers=[("ETag", rule_etag(entry)), *headers])


def _not_found(rule_id: str) -> Response:
    return problem(404, "no such rule", f"no rule '{show(rule_id)}'")


def _rule_error(e: RuleError, status: int, title: str) -> Response:
    if isinstance(e, StoreError):     # the database, not the request
        return problem(500, "rule change not stored", str(e), code="ERR")
    return problem(status, title, str(e), code="ERR", field=e.field)


# Titles of the RESP errors a rule change can meet, by code.
_TITLES = {"READONLY": "read-only replica", "CLUSTERDOWN": "rule change refused"}


def _resp_error(e: ReplyError, status: int) -> Response:
    code, _, detail = str(e).partition(" ")
    # ERR: in force here, but not yet on every primary (Cluster.rule_change).
    title = _TITLES.get(code, "rule change incomplete")
    return problem(status, title, detail or code, code=code)


def _readonly() -> Response:
    return _resp_error(ReplyError(READONLY_ERROR), 503)


# ---- changes, here or cluster-wide --------------------------------------------------

def _rule_change(req: Request, change):
    """Runs `change` (which returns the Response) as CL.RULE's changes
    run: directly, or in cluster mode through Cluster.rule_change, whose
    refusal (CLUSTERDOWN: another primary is not reachable) is a 503.
    Returns the Response, or an awaitable of it."""
    cluster = req.server.cluster
    if not cluster.enabled:
        return change()
    return _cluster_wide(cluster.rule_change(change))


async def _cluster_wide(awaitable) -> Response:
    try:
        return await awaitable
    except ReplyError as e:
        return _resp_error(e, 503)


# ---- handlers -----------------------------------------------------------------------

def put_rule(req: Request):
    rule_id = req.params["id"]
    if req.server.core.readonly:
        return _readonly()
    try:
        check_rule_id(rule_id)
    except RuleError as e:
        return _rule_error(e, 400, "invalid rule id")
    if req.server.rules_store is not None:
        return _put_in_store(req, rule_id)

    def change() -> Response:
        registry = req.server.rules
        old = registry.entry(rule_id)
        refused = _refusal(req, _etag(old))
        if refused is not None:
            return refused
        try:
            registry.set(rule_id, req.body)     # as CL.RULE SET does
        except DocumentError as e:
            return _rule_error(e, 400, "malformed rule document")
        except RuleError as e:
            return _rule_error(e, 422, "invalid rule")
        entry = registry.entry(rule_id)
        if old is not None:
            return _rule_response(200, entry)
        return _rule_response(201, entry, [("Location", location(rule_id))])
    return _rule_change(req, change)


def get_rule(req: Request) -> Response:
    rule_id = req.params["id"]
    entry = req.server.rules.entry(rule_id)
    refused = _refusal(req, _etag(entry))
    if refused is not None:
        return refused
    if entry is None:
        return _not_found(rule_id)
    return _rule_response(200, entry)


def delete_rule(req: Request):
    rule_id = req.params["id"]
    if req.server.core.readonly:
        return _readonly()
    if req.server.rules_store is not None:
        return _delete_in_store(req, rule_id)

    def change() -> Response:
        registry = req.server.rules
        refused = _refusal(req, _etag(registry.entry(rule_id)))
        if refused is not None:
            return refused
        try:
            deleted = registry.delete(rule_id)
        except RuleError as e:
            return _rule_error(e, 500, "rule not deleted")
        return Response(204) if deleted else _not_found(rule_id)
    return _rule_change(req, change)


# ---- through a PostgreSQL rules-store -------------------------------------------------
#
# The preconditions are checked against the rule in force here, and the
# write is made conditional on that rule's version in the table: a writer
# on another node that changed it since makes the write refuse, so of two
# writers holding one ETag exactly one wins, wherever they are.

def _expected_version(req: Request, entry: Entry | None) -> int | None:
    """The version the table must still hold for the write to go ahead
    (0: no row at all), or None when the request sets no precondition."""
    if req.headers.get("if-match") is not None:
        assert entry is not None        # else _refusal answered 412
        return entry.version
    if req.headers.get("if-none-match") is not None:
        return 0
    return None


async def _put_in_store(req: Request, rule_id: str) -> Response:
    registry = req.server.rules
    old = registry.entry(rule_id)
    refused = _refusal(req, _etag(old))
    if refused is not None:
        return refused
    try:
        rule = parse_rule(rule_id, req.body)
        await req.server.rules_store.write(
            [Write(rule_id, rule.to_json(), SOURCE_COMMAND, _expected_version(req, old))])
    except DocumentError as e:
        return _rule_error(e, 400, "malformed rule document")
    except RuleError as e:
        return _rule_error(e, 422, "invalid rule")
    except Conflict:
        return _changed_meanwhile(registry.entry(rule_id))
    except ReplyError as e:       # StoreUnavailable: TRYAGAIN
        return _resp_error(e, 503)
    entry = registry.entry(rule_id)
    if entry is None:             # deleted again already (by another writer)
        return _changed_meanwhile(None)
    if old is not None:
        return _rule_response(200, entry)
    return _rule_response(201, entry, [("Location", location(rule_id))])


async def _delete_in_store(req: Request, rule_id: str) -> Response:
    registry = req.server.rules
    old = registry.entry(rule_id)
    refused = _refusal(req, _etag(old))
    if refused is not None:
        return refused
    if old is None:
        return _not_found(rule_id)
    expect = old.version if req.headers.get("if-match") is not None else None
    try:
        await req.server.rules_store.write([Write(rule_id, None, SOURCE_COMMAND, expect)])
    except Conflict:
        return _changed_meanwhile(registry.entry(rule_id))
    except ReplyError as e:
        return _resp_error(e, 503)
    return Response(204)


def _changed_meanwhile(entry: Entry | None) -> Response:
    """412 for a write whose precondition held here but no longer in the
    table: another writer changed the rule first (this node has read it
    since, so the ETag given is the current one)."""
    etag = _etag(entry)
    detail = ("another writer changed the rule first; "
              + (f"the current ETag is {etag}" if etag else "there is no such rule now"))
    return problem(412, "precondition failed", detail,
                   headers=[("ETag", etag)] if etag else [])


def list_rules(req: Request) -> Response:
    listing = b"[" + b",".join(_listed(entry) for entry in req.server.rules.entries()) + b"]"
    # The body is a function of the listing alone, so its hash is a
    # strong validator of the body that holds it.
    etag = _tag(hashlib.sha256(listing).hexdigest())
    refused = _refusal(req, etag)
    if refused is not None:
        return refused
    body = b'{"etag":' + _json(etag) + b',"rules":' + listing + b"}"
    return Response(200, body, headers=[("ETag", etag)])


def _listed(entry: Entry) -> bytes:
    # Joined from the rule's document as made once, not serialised again.
    return (b'{"id":' + _json(entry.rule.id) + b',"etag":' + _json(rule_etag(entry))
            + b',"source":' + _json(entry.source) + b',"rule":' + entry.rule.document + b"}")


def _json(text: str) -> bytes:
    return json.dumps(text, ensure_ascii=False).encode("utf-8")


ROUTES = [
    (method, prefix + path, handler)
    for prefix in ("/v1", "")
    for method, path, handler in [
        ("GET", "/rules", list_rules),
        ("PUT", "/rules/{id}", put_rule),
        ("GET", "/rules/{id}", get_rule),
        ("DELETE", "/rules/{id}", delete_rule),
    ]
]
