"""Arguments from the wire, read the same way by every command.

There is one integer parser, Redis's ``string2ll`` rules implemented in
C (``fastlimit._resp.parse_integer``), which the fast paths use too: a
command handler or ``CONFIG SET`` never falls back to Python's ``int()``,
which would accept ``+5``, `` 5``, ``0_5`` and non-ASCII digits.
"""

from __future__ import annotations

from fastlimit._resp import ReplyError, parse_integer

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def integer(value: bytes | str, what: str = "value",
            low: int = INT64_MIN, high: int = INT64_MAX) -> int:
    """The integer in value, or ``ERR <what> is not an integer or out of
    range`` (Redis's text) when it is malformed or outside [low, high]."""
    n = parse_integer(value)
    if n is None or not low <= n <= high:
        raise ReplyError(f"ERR {what} is not an integer or out of range")
    return n


def lowercase(value: bytes) -> str:
    """A keyword argument (an option, a subcommand) for comparing: invalid
    UTF-8 becomes U+FFFD, so it matches no keyword rather than raising."""
    return value.decode("utf-8", "replace").lower()


def check_client_name(name: bytes) -> None:
    """Redis's rule for CLIENT SETNAME and HELLO SETNAME: printable ASCII
    without spaces, so that CLIENT LIST stays one parseable line."""
    if any(c < 33 or c > 126 for c in name):
        raise ReplyError("ERR Client names cannot contain spaces, newlines or special characters.")
