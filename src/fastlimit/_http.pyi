from typing import Any

REASONS: dict[int, str]
ERROR_STATUS: dict[str, int]
FAST_ENDPOINTS: dict[bytes, int]
FAST_ENDPOINT_NAMES: dict[int, str]
OPEN_PATHS: frozenset[bytes]
CONTINUE: bytes

class BadField(Exception):
    field: str | None
    detail: str
    status: int
    def __init__(self, field: str | None, detail: str, status: int = 400) -> None: ...

class Refused(Exception):
    error: str
    def __init__(self, error: str) -> None: ...

class HttpShared:
    core: Any
    front: Any
    response_type: type
    max_header_bytes: int
    max_headers: int
    max_body_bytes: int
    header_timeout_ns: int
    body_timeout_ns: int
    body_memory: int
    body_bytes: int
    batch_max: int
    metrics_auth: bool
    connections: set[HttpConnection]
    endpoint_stats: dict[str, Any]
    total_requests: int
    total_connections: int
    rejected_connections: int
    bad_requests: int
    def __init__(self, core: Any, front: Any) -> None: ...
    def set_date(self, http_date: str) -> None: ...
    def sweep(self) -> None: ...

class HttpConnection:
    def __init__(self, shared: HttpShared) -> None: ...
    def connection_made(self, transport: Any) -> None: ...
    def connection_lost(self, exc: BaseException | None) -> None: ...
    def close(self) -> None: ...
    def eof_received(self) -> bool: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...
    def data_received(self, data: bytes) -> None: ...
    def next_turn(self) -> None: ...
    def task_done(self, task: Any) -> None: ...

def status_line(status: int) -> bytes: ...

STATUS_LINES: dict[int, bytes]
