"""envoyproxy/ratelimit's HTTP ``/json`` endpoint (src/server/server_impl.go:
NewJsonHandler): a protojson ``RateLimitRequest`` in, the decision of the
gRPC front (``server.rls.service``) as a protojson ``RateLimitResponse``
out, for callers that cannot speak gRPC (Lua, curl).

As the reference answers: 200 for OK, 429 for OVER_LIMIT, 500 for
UNKNOWN, each with ``Content-Type: application/json``; 400 with Go's
``http.Error`` body (``Bad Request``, text/plain) for a body protojson
refuses and for any error of the service.  The reason, which the
reference only logs, is in a ``Fastlimit-Error`` header.  The reference
serves /json whatever the method (a GET has no body, so it gets the
400); here GET and POST are served and other methods get 405.

The request is read as protojson.Unmarshal reads it: field names in
lowerCamelCase or as in the .proto, an unknown or repeated field is an
error, ``null`` leaves a field unset, integers as JSON numbers or
strings holding one (``1.0`` and ``1e2`` are integers, ``1.5`` is not),
enums by name or number.  The response is written as protojson.Marshal
writes it: fields in declaration order, zero values left out
(``limitRemaining`` at 0, ``requestsPerUnit`` of a limit of 0), enums by
name, the reset as a Duration string ("42s").
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable

from fastlimit._resp import ReplyError, parse_integer
from fastlimit.rls.config import UNIT_NAMES
from fastlimit.rls.service import OK, OVER_LIMIT, RlsError, RlsHome
from fastlimit.server.http.routes import Request, Response

CODE_NAMES = {0: "UNKNOWN", OK: "OK", OVER_LIMIT: "OVER_LIMIT"}
HTTP_STATUS = {OK: 200, OVER_LIMIT: 429}
# envoy.type.v3.RateLimitUnit, the descriptor limit's enum (it has no WEEK)
OVERRIDE_UNITS = {"UNKNOWN": 0, "SECOND": 1, "MINUTE": 2, "HOUR": 3, "DAY": 4, "MONTH": 5,
                  "YEAR": 6}
UINT32_MAX, UINT64_MAX, INT32_MIN, INT32_MAX = 2**32 - 1, 2**64 - 1, -2**31, 2**31 - 1
# protojson's longest integer: uint64's 20 digits
MAX_DIGITS = 20
# A JSON number (RFC 8259), in parts: sign, integer part, fraction, exponent.
NUMBER = re.compile(r"(-?)(0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE]([+-]?[0-9]+))?")
MAX_REASON = 300


class BadBody(Exception):
    """A body protojson.Unmarshal refuses: the reason."""


class _Number(str):
    """A JSON number's text, kept for protojson's integer rules."""


class _Object(list):
    """A JSON object's (name, value) pairs in order, repeated names kept."""


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_int=_Number, parse_float=_Number,
                            parse_constant=_refuse_constant, object_pairs_hook=_Object)


def _names(*proto_names: str) -> dict[str, str]:
    """A message's fields by both names protojson accepts: the JSON name
    (lowerCamelCase) and the .proto name."""
    out = {}
    for name in proto_names:
        head, *rest = name.split("_")
        out[head + "".join(p.capitalize() for p in rest)] = name
        out[name] = name
    return out


REQUEST = _names("domain", "descriptors", "hits_addend")
DESCRIPTOR = _names("entries", "limit", "hits_addend")
ENTRY = _names("key", "value")
OVERRIDE = _names("requests_per_unit", "unit")


# ---- the request ----------------------------------------------------------------------

def parse_request(body: bytes):
    """(domain, descriptors, hits_addend) as should_rate_limit takes them,
    or BadBody."""
    try:
        doc = _DECODER.decode(body.decode("utf-8"))
    except (ValueError, RecursionError) as e:     # UnicodeDecodeError is a ValueError
        raise BadBody(f"the body is not JSON: {e}") from None
    fields = _fields(doc, REQUEST, "RateLimitRequest")
    domain = _string(fields.get("domain", ""), "domain")
    descriptors = [_descriptor(d) for d in _list(fields.get("descriptors", []), "descriptors")]
    hits = _uint(fields.get("hits_addend", "0"), UINT32_MAX, "hitsAddend")
    return domain, descriptors, hits


def _descriptor(doc):
    fields = _fields(doc, DESCRIPTOR, "RateLimitDescriptor")
    entries = []
    for e in _list(fields.get("entries", []), "entries"):
        entry = _fields(e, ENTRY, "Entry")
        entries.append((_string(entry.get("key", ""), "key"),
                        _string(entry.get("value", ""), "value")))
    override = None
    if "limit" in fields:
        limit = _fields(fields["limit"], OVERRIDE, "RateLimitOverride")
        override = (_uint(limit.get("requests_per_unit", "0"), UINT32_MAX, "requestsPerUnit"),
                    _enum(limit.get("unit", "UNKNOWN"), OVERRIDE_UNITS, "unit"))
    hits = _uint(fields["hits_addend"], UINT64_MAX, "hitsAddend") \
        if "hits_addend" in fields else None
    return entries, override, hits


def _fields(doc, names: dict[str, str], message: str) -> dict:
    """An object's fields by .proto name; a field given as null is unset."""
    if not isinstance(doc, _Object):
        raise BadBody(f"{message} must be an object")
    out: dict = {}
    seen = set()
    for name, value in doc:
        field = names.get(name)
        if field is None:
            raise BadBody(f"unknown field {_shown(name)} in {message}")
        if field in seen:
            raise BadBody(f"duplicate field {_shown(name)} in {message}")
        seen.add(field)
        if value is not None:
            out[field] = value
    return out


def _list(value, field: str) -> list:
    if isinstance(value, _Object) or not isinstance(value, list):
        raise BadBody(f"{field} must be an array")
    return value


def _string(value, field: str) -> bytes:
    if not isinstance(value, str) or isinstance(value, _Number):
        raise BadBody(f"{field} must be a string")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        # a lone surrogate escape ("\\ud800"), which Go's decoder refuses
        raise BadBody(f"{field} holds an invalid escape code") from None


def _uint(value, high: int, field: str) -> int:
    """A uint32 or uint64 field: a number, or a string holding exactly one."""
    n = None
    if isinstance(value, _Number):
        n = integer_value(value)
    elif isinstance(value, str):
        n = integer_value(value)      # None unless the whole string is a number
    if n is None or not 0 <= n <= high:
        raise BadBody(f"invalid value for {field}: {_shown(value)}")
    return n


def _enum(value, names: dict[str, int], field: str) -> int:
    """An enum field: a name of its enum, or any int32 number."""
    n = names.get(value) if isinstance(value, str) and not isinstance(value, _Number) else None
    if isinstance(value, _Number):
        n = integer_value(value)
        if n is not None and not INT32_MIN <= n <= INT32_MAX:
            n = None
    if n is None:
        raise BadBody(f"invalid value for enum field {field}: {_shown(value)}")
    return n


def integer_value(text: str) -> int | None:
    """The integer a JSON number stands for, as protojson's
    normalizeToIntString reads it (an exponent shifts the digits; what is
    left of the point must be all there is), or None; at most 20 digits."""
    m = NUMBER.fullmatch(text)
    if m is None:
        return None
    sign, whole, fraction, exponent = m.groups()
    whole = "" if whole == "0" else whole
    fraction = (fraction or "").rstrip("0")
    if not whole and not fraction:
        return 0
    shift = _exponent(exponent) if exponent else 0
    if shift is None:
        return None
    if shift >= 0:
        if len(fraction) > shift or len(whole) + shift > MAX_DIGITS:
            return None
        digits = whole + fraction + "0" * (shift - len(fraction))
    else:
        point = len(whole) + shift
        if fraction or point < 0 or whole[point:].strip("0"):
            return None
        digits = whole[:point]
    digits = digits.lstrip("0") or "0"
    if len(digits) > MAX_DIGITS:
        return None
    n = _digits_value(digits)
    if n is None:
        return None
    return -n if sign else n


def _exponent(text: str) -> int | None:
    """An exponent as Go's strconv.ParseInt(s, 10, 32) takes it: a sign
    and leading zeros allowed."""
    negative = text[0] == "-"
    digits = text.lstrip("+-").lstrip("0") or "0"
    if len(digits) > 10:
        return None
    n = parse_integer(digits)
    if n is None or n > (2**31 if negative else 2**31 - 1):
        return None
    return -n if negative else n


def _digits_value(digits: str) -> int | None:
    """1 to 20 ASCII digits without leading zeros, by the one integer
    parser (int64): a twentieth digit is added by hand, as no 20-digit
    number fits int64 but every uint64 one's first 19 digits do."""
    if len(digits) < MAX_DIGITS:
        return parse_integer(digits)
    head = parse_integer(digits[:-1])
    return None if head is None else head * 10 + ord(digits[-1]) - 48


def _shown(value) -> str:
    text = value if isinstance(value, _Number) else json.dumps(value, ensure_ascii=True)
    return text[:100]


# ---- the response ---------------------------------------------------------------------

def status_json(status) -> dict:
    """A DescriptorStatus as protojson writes it (zero values left out)."""
    code, current, remaining, reset = status
    out: dict = {}
    if code:
        out["code"] = CODE_NAMES.get(code, code)
    if current is not None:
        rpu, unit, name = current
        limit: dict = {}
        if name:
            limit["name"] = name.decode("utf-8", "replace")
        if rpu:
            limit["requestsPerUnit"] = rpu
        if unit:
            limit["unit"] = UNIT_NAMES.get(unit, unit)
        out["currentLimit"] = limit
    if remaining:
        out["limitRemaining"] = remaining
    if current is not None or reset:
        # present whenever the gRPC front sends it
        out["durationUntilReset"] = f"{reset}s"
    return out


def response_json(overall: int, statuses, headers) -> dict:
    out: dict = {}
    if overall:
        out["overallCode"] = CODE_NAMES.get(overall, overall)
    if statuses:
        out["statuses"] = [status_json(s) for s in statuses]
    if headers:
        out["responseHeadersToAdd"] = [header_json(k, v) for k, v in headers]
    return out


def header_json(key: bytes, value: bytes) -> dict:
    out = {}
    if key:
        out["key"] = key.decode("latin-1")
    if value:
        out["value"] = value.decode("latin-1")
    return out


def bad_request(reason: str) -> Response:
    """Go's http.Error(w, "Bad Request", 400), with the reason the
    reference would log."""
    safe = "".join(c if " " <= c <= "~" else "?" for c in reason)[:MAX_REASON]
    return Response(400, b"Bad Request\n", "text/plain; charset=utf-8",
                    [("X-Content-Type-Options", "nosniff"), ("Fastlimit-Error", safe)])


def rls_json(req: Request) -> Response | Awaitable[Response]:
    try:
        domain, descriptors, hits = parse_request(req.body)
        overall, statuses, headers = req.server.rls.service.should_rate_limit(
            domain, descriptors, hits)
    except (BadBody, RlsError) as e:
        return bad_request(str(e))
    except RlsHome as e:
        return _asked_of_home(req, e.home, domain, descriptors, hits)
    return decision_response(overall, statuses, headers)


def decision_response(overall: int, statuses, headers) -> Response:
    body = json.dumps(response_json(overall, statuses, headers), separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")
    return Response(HTTP_STATUS.get(overall, 500), body)


async def _asked_of_home(req: Request, home: int, domain: bytes, descriptors,
                         hits: int) -> Response:
    """A request with a home limit of another region: that region's
    decision, or 500 as the reference's when its store fails (Envoy's
    failure_mode_deny decides) if it does not answer in time."""
    try:
        decision = await req.server.regions_sync.ask_home_rls(home, domain, descriptors, hits)
    except ReplyError as e:
        return Response(500, f"{e}\n".encode(), "text/plain; charset=utf-8")
    if decision is None:
        name = req.server.regions.names[home]
        return Response(500, f"home region {name} unreachable\n".encode(),
                        "text/plain; charset=utf-8")
    return decision_response(*decision)


ROUTES = [("POST", "/json", rls_json), ("GET", "/json", rls_json)]
