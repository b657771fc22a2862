"""A raw RESP2/RESP3 client that also decodes a reply into Python
values, keeping what the wire said (a simple string, an error, a set, a
verbatim string: each its own type), for the tests of each command's
exact reply (tests/server/commands/)."""

from __future__ import annotations

import hiredis
from wire import Wire, command


class Simple(str):
    """+simple string"""


class Err(str):
    """-error"""


class RSet(list):
    """~set (RESP3); a plain array in RESP2"""


class Verbatim(bytes):
    """=verbatim string (RESP3)"""


class Raw(Wire):
    """A raw connection that can also decode a reply into Python values."""

    def value(self, *args):
        return decode(self.call(*args))


def decode(data: bytes):
    value, pos = _decode(data, 0)
    assert pos == len(data), f"trailing bytes after a reply: {data[pos:]!r}"
    return value


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def _decode(data: bytes, pos: int):
    eol = data.index(b"\r\n", pos)
    kind, head, nxt = data[pos:pos + 1], data[pos + 1:eol], eol + 2
    if kind == b"+":
        return Simple(head.decode()), nxt
    if kind == b"-":
        return Err(head.decode()), nxt
    if kind == b":":
        return int(head), nxt
    if kind == b"_":
        assert head == b""
        return None, nxt
    if kind == b"#":
        assert head in (b"t", b"f")
        return head == b"t", nxt
    if kind in b"$=":
        n = int(head)
        if n < 0:
            assert kind == b"$" and n == -1
            return None, nxt
        body = data[nxt:nxt + n]
        assert data[nxt + n:nxt + n + 2] == b"\r\n", "bulk not followed by CRLF"
        return (Verbatim(body) if kind == b"=" else body), nxt + n + 2
    if kind in b"*~":
        n = int(head)
        if n < 0:
            assert kind == b"*" and n == -1
            return None, nxt
        items = []
        for _ in range(n):
            item, nxt = _decode(data, nxt)
            items.append(item)
        return (RSet(items) if kind == b"~" else items), nxt
    if kind == b"%":
        out = {}
        for _ in range(int(head)):
            k, nxt = _decode(data, nxt)
            v, nxt = _decode(data, nxt)
            out[_hashable(k)] = v
        return out, nxt
    raise AssertionError(f"unexpected RESP type {kind!r} in {data!r}")


def pairs(flat: list) -> dict:
    """A RESP2 flattened map as a dict."""
    assert len(flat) % 2 == 0, flat
    return dict(zip(flat[0::2], flat[1::2]))


def as_map(value, proto: int) -> dict:
    if proto == 3:
        assert isinstance(value, dict), value
        return value
    assert isinstance(value, list), value
    return pairs(value)


def well_formed(data: bytes):
    """hiredis, the parser redis-cli and redis-py use, reads exactly one reply."""
    reader = hiredis.Reader()
    reader.feed(data)
    value = reader.gets()
    assert value is not False, "incomplete reply"
    assert reader.gets() is False, "more than one reply"
    return value


def run_sequence(port: int, commands) -> list[bytes]:
    """Each command's raw reply on one fresh connection; b'<closed>' once
    the server hangs up."""
    out = []
    with Raw.to(port) as conn:
        for cmd in commands:
            try:
                conn.send(cmd if isinstance(cmd, bytes) else command(*cmd))
                out.append(conn.read_reply())
            except (EOFError, ConnectionResetError, BrokenPipeError):
                out.append(b"<closed>")
                break
    return out


def info_fields(text: bytes) -> dict:
    out = {}
    for line in text.decode().split("\r\n"):
        if line and not line.startswith("#"):
            key, _, value = line.partition(":")
            out[key] = value
    return out
