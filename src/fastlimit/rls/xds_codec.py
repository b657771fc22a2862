"""The protobuf messages of an xDS State-of-the-World (ADS) client for
envoyproxy/ratelimit's RateLimitConfig, by hand: what
``envoy.service.discovery.v3.AggregatedDiscoveryService`` carries and
``ratelimit.config.ratelimit.v3`` (api/ratelimit/config/ratelimit/v3/
rls_conf.proto) defines, and nothing else.  No network here:
rls/xds_client.py drives the stream.

Decoding follows protobuf's rules: unknown fields (and a known field sent
with another wire type) are skipped, the last of a repeated scalar wins,
the occurrences of a message field merge, strings must be UTF-8.  Every
length is checked against what is left; bytes that are not protobuf give
XdsError, never an exception of another kind.

A RateLimitConfig becomes the same document the reference's YAML gives
(config.ConfigXdsProtoToYaml), so config.load_documents checks it with
the YAML's checks and words its errors the same way.
"""

from __future__ import annotations

TYPE_URL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
ADS_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"

# ratelimit.config.ratelimit.v3.RateLimitUnit; an unknown number reads as
# Go's String() of it (the number), which the loader then refuses.
UNIT_NAMES = {0: "UNKNOWN", 1: "SECOND", 2: "MINUTE", 3: "HOUR", 4: "DAY", 5: "MONTH",
              6: "YEAR", 7: "WEEK"}

# Descriptors within descriptors: deeper than this is refused before
# Python's own recursion limit is near.
MAX_DEPTH = 64

VARINT, FIXED64, LENGTH, START_GROUP, END_GROUP, FIXED32 = 0, 1, 2, 3, 4, 5


class XdsError(Exception):
    """Bytes that are not the message they should be."""


# ---- encoding --------------------------------------------------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | LENGTH) + _varint(len(payload)) + payload


def _string_field(number: int, text: str) -> bytes:
    """A proto3 string: absent when empty."""
    return _bytes_field(number, text.encode("utf-8")) if text else b""


def encode_node(node_id: str, user_agent: str, version: str) -> bytes:
    """config.core.v3.Node {1 id, 6 user_agent_name, 7 user_agent_version}."""
    return _string_field(1, node_id) + _string_field(6, user_agent) + _string_field(7, version)


def encode_discovery_request(node: bytes, version_info: str, response_nonce: str,
                             error: tuple[int, str] | None = None,
                             type_url: str = TYPE_URL) -> bytes:
    """DiscoveryRequest {1 version_info, 2 node, 3 resource_names (none: all),
    4 type_url, 5 response_nonce, 6 error_detail google.rpc.Status {1 code,
    2 message}}; error is (code, message) for a NACK."""
    out = _string_field(1, version_info) + _bytes_field(2, node) + _string_field(4, type_url)
    out += _string_field(5, response_nonce)
    if error is not None:
        code, message = error
        status = (_varint(1 << 3 | VARINT) + _varint(code) if code else b"") + \
            _string_field(2, message)
        out += _bytes_field(6, status)
    return out


# ---- decoding --------------------------------------------------------------------------------

def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    end = min(len(data), i + 10)
    while i < end:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value & 0xFFFFFFFFFFFFFFFF, i
        shift += 7
    raise XdsError("malformed protobuf: truncated or overlong varint")


def _skip_group(data: bytes, i: int, number: int) -> int:
    """Past the END_GROUP that closes a group of this field number."""
    open_groups = [number]
    while open_groups:
        key, i = _read_varint(data, i)
        wire = key & 7
        if wire == END_GROUP:
            if key >> 3 != open_groups.pop():
                raise XdsError("malformed protobuf: mismatched end group")
        elif wire == START_GROUP:
            open_groups.append(key >> 3)
            if len(open_groups) > MAX_DEPTH:
                raise XdsError("malformed protobuf: groups nested too deeply")
        else:
            i = _skip(data, i, wire)
    return i


def _skip(data: bytes, i: int, wire: int) -> int:
    if wire == VARINT:
        return _read_varint(data, i)[1]
    if wire == FIXED64:
        i += 8
    elif wire == FIXED32:
        i += 4
    elif wire == LENGTH:
        n, i = _read_varint(data, i)
        i += n
    else:
        raise XdsError(f"malformed protobuf: wire type {wire}")
    if i > len(data):
        raise XdsError("malformed protobuf: field runs past the end")
    return i


def fields(data: bytes):
    """(number, wire type, value) of each field in order: an int for a
    varint, bytes for a length-delimited field; fixed-width and group
    fields are skipped (no message here has one)."""
    i, n = 0, len(data)
    while i < n:
        key, i = _read_varint(data, i)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise XdsError("malformed protobuf: field number 0")
        if wire == VARINT:
            value, i = _read_varint(data, i)
            yield number, wire, value
        elif wire == LENGTH:
            size, i = _read_varint(data, i)
            if size > n - i:
                raise XdsError("malformed protobuf: length runs past the end")
            yield number, wire, data[i:i + size]
            i += size
        elif wire == START_GROUP:
            i = _skip_group(data, i, number)
        elif wire == END_GROUP:
            raise XdsError("malformed protobuf: end group without a start")
        else:
            i = _skip(data, i, wire)


def _text(value: bytes, what: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise XdsError(f"{what}: string field contains invalid UTF-8") from None


class _Message:
    """A message's known fields by protobuf's rules.  schema: number ->
    (name, kind); kinds: "string", "bool", "uint32", "enum", "message"
    (bytes, occurrences merged), "repeated" (a list of bytes)."""

    def __init__(self, data: bytes, schema: dict, what: str):
        self.values: dict = {}
        for number, wire, value in fields(data):
            spec = schema.get(number)
            if spec is None or (wire == VARINT) != (spec[1] in ("bool", "uint32", "enum")):
                continue        # unknown, or a wire type the field cannot have: skipped
            name, kind = spec
            if kind == "string":
                self.values[name] = _text(value, what)
            elif kind == "bool":
                self.values[name] = value != 0
            elif kind == "uint32":
                self.values[name] = value & 0xFFFFFFFF
            elif kind == "enum":
                v = value & 0xFFFFFFFF
                self.values[name] = v - (1 << 32) if v >> 31 else v
            elif kind == "message":
                self.values[name] = self.values.get(name, b"") + value
            else:
                self.values.setdefault(name, []).append(value)

    def get(self, name: str, default=None):
        return self.values.get(name, default)


_RESPONSE = {1: ("version_info", "string"), 2: ("resources", "repeated"),
             4: ("type_url", "string"), 5: ("nonce", "string")}
_ANY = {1: ("type_url", "string"), 2: ("value", "message")}
_CONFIG = {1: ("name", "string"), 2: ("domain", "string"), 3: ("descriptors", "repeated")}
_DESCRIPTOR = {1: ("key", "string"), 2: ("value", "string"), 3: ("rate_limit", "message"),
               4: ("descriptors", "repeated"), 5: ("shadow_mode", "bool"),
               6: ("detailed_metric", "bool"), 7: ("quota_mode", "bool")}
# 8 metadata (google.protobuf.Struct) is skipped: the service does not use it
_POLICY = {1: ("unit", "enum"), 2: ("requests_per_unit", "uint32"), 3: ("unlimited", "bool"),
           4: ("name", "string"), 5: ("replaces", "repeated")}
_REPLACE = {1: ("name", "string")}


class DiscoveryResponse:
    __slots__ = ("version_info", "type_url", "nonce", "resources")

    def __init__(self, version_info: str, type_url: str, nonce: str, resources: list):
        self.version_info = version_info
        self.type_url = type_url
        self.nonce = nonce
        self.resources = resources      # [(type_url, value bytes)]


def decode_discovery_response(data: bytes) -> DiscoveryResponse:
    """DiscoveryResponse {1 version_info, 2 resources (Any {1 type_url,
    2 value}), 4 type_url, 5 nonce}."""
    m = _Message(data, _RESPONSE, "DiscoveryResponse")
    resources = []
    for raw in m.get("resources", []):
        any_ = _Message(raw, _ANY, "DiscoveryResponse.resources")
        resources.append((any_.get("type_url", ""), any_.get("value", b"")))
    return DiscoveryResponse(m.get("version_info", ""), m.get("type_url", ""),
                             m.get("nonce", ""), resources)


def decode_rate_limit_config(data: bytes) -> tuple[str, dict]:
    """A RateLimitConfig as (name, the document its YAML would be)."""
    m = _Message(data, _CONFIG, "RateLimitConfig")
    doc = {"domain": m.get("domain", ""),
           "descriptors": [_descriptor(d, 1) for d in m.get("descriptors", [])]}
    return m.get("name", ""), doc


def _descriptor(data: bytes, depth: int) -> dict:
    if depth > MAX_DEPTH:
        raise XdsError(f"RateLimitConfig: descriptors nested deeper than {MAX_DEPTH}")
    m = _Message(data, _DESCRIPTOR, "RateLimitDescriptor")
    doc = {"key": m.get("key", ""), "value": m.get("value", ""),
           "descriptors": [_descriptor(d, depth + 1) for d in m.get("descriptors", [])],
           "shadow_mode": m.get("shadow_mode", False),
           "detailed_metric": m.get("detailed_metric", False),
           "quota_mode": m.get("quota_mode", False)}
    policy = m.get("rate_limit")
    if policy is not None:
        doc["rate_limit"] = _policy(policy)
    return doc


def _policy(data: bytes) -> dict:
    m = _Message(data, _POLICY, "RateLimitPolicy")
    unit = m.get("unit", 0)
    return {"unit": UNIT_NAMES.get(unit, str(unit)),
            "requests_per_unit": m.get("requests_per_unit", 0),
            "unlimited": m.get("unlimited", False),
            "name": m.get("name", ""),
            "replaces": [{"name": _Message(r, _REPLACE, "RateLimitReplace").get("name", "")}
                         for r in m.get("replaces", [])]}


def rate_limit_documents(response: DiscoveryResponse) -> list[tuple[str, dict]]:
    """Each resource of a response as (name, document), in order; XdsError
    if one is not a RateLimitConfig.  A resource without a name is named
    by its place, so an error still says which one."""
    if response.type_url != TYPE_URL:
        raise XdsError(f"unexpected type_url '{response.type_url}' (this client asks "
                       f"for {TYPE_URL})")
    out = []
    for i, (type_url, value) in enumerate(response.resources):
        if type_url != TYPE_URL:
            raise XdsError(f"resource {i}: mismatched message type '{type_url}'")
        name, doc = decode_rate_limit_config(value)
        out.append((name or f"resource {i}", doc))
    return out
