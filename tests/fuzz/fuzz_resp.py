"""RESP commands as a client sends them (_resp.pyx's Parser): parsed in one
read and in reads cut anywhere, which must give the same commands and the
same error; a command never uses more bytes than it was given."""

import sys

import harness

with harness.instrumented():
    from fastlimit import _resp


def one_input(data: bytes) -> None:
    unauthenticated = bool(data[:1]) and data[0] & 1 == 1
    body = data[1:]
    commands, used, error = _resp.parse(body, unauthenticated=unauthenticated)
    if not 0 <= used <= len(body):
        raise harness.Finding(f"used {used} of {len(body)} bytes")
    streamed, stream_error, rest, _ = _resp.parse_stream(
        harness.split(data), unauthenticated=unauthenticated)
    if streamed != commands or stream_error != error:
        raise harness.Finding(f"one read: {commands!r} {error!r}; "
                              f"cut reads: {streamed!r} {stream_error!r}")
    if error is None and rest != body[used:]:
        raise harness.Finding(f"left {rest!r}, not {body[used:]!r}")


if __name__ == "__main__":
    harness.main(one_input)
    sys.exit(0)
