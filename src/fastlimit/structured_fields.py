"""HTTP Structured Field values (RFC 9651) that more than one front writes:
the RateLimit-Policy and RateLimit headers of the HTTP listener and of the
Envoy rate limit service name their policies with these."""

from __future__ import annotations


def sf_string(text: str) -> str:
    """A Structured Field string: printable ASCII, with \\ and " escaped;
    anything else in a name becomes "?"."""
    safe = "".join(c if " " <= c <= "~" else "?" for c in text)
    return '"' + safe.replace("\\", "\\\\").replace('"', '\\"') + '"'
