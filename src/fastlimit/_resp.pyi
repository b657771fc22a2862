"""Type stubs for the compiled RESP layer (fastlimit/_resp.pyx): the reply
types command handlers return, and the parsers Python code and tests call."""

from collections.abc import Generator, Iterable
from typing import Any

class SimpleString(str):
    """A reply sent as a RESP simple string (+OK)."""

class Verbatim(str):
    """Text sent as a RESP3 verbatim string, or a bulk string on RESP2."""

NO_REPLY: object

class Sliced:
    """A reply made in slices: each next() of steps does a bounded piece of
    work; the generator's return value is the reply."""

    steps: Generator[Any, Any, Any]
    reply: Any

    def __init__(self, steps: Generator[Any, Any, Any]) -> None: ...
    def advance(self, budget_s: float) -> bool: ...
    def finish(self) -> Any: ...

class ReplyError(Exception):
    """Sent to the client as -<message>."""

def parse(data: bytes, *, max_bulk_len: int = ..., max_multibulk_len: int = ...,
          unauthenticated: bool = False) -> tuple[list[list[bytes]], int, str | None]: ...
def parse_stream(chunks: Iterable[bytes], *, max_bulk_len: int = ...,
                 max_multibulk_len: int = ..., unauthenticated: bool = False
                 ) -> tuple[list[list[bytes]], str | None, bytes, int]: ...
def parse_integer(data: object) -> int | None: ...
