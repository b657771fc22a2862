"""Type stubs for the compiled connection layer (fastlimit/_protocol.pyx):
the command table's entries, the server state shared by connections, and
the asyncio protocol of one client connection."""

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable, Sequence, Sized
from typing import Any

from fastlimit._core import BucketStore, Clock
from fastlimit._load import LoadMeter
from fastlimit._rules import RuleEngine

READONLY_ERROR: str
LATENCY_BOUNDS: tuple[float, ...]

def glob(pattern: bytes, string: bytes) -> bool: ...
def acl_check(grant: tuple[bytes, tuple | None, tuple | None] | None, cmd: Command,
              args: list[bytes]) -> int:
    """0 if the grant admits cmd with args, -1 if not the command, else the
    position of the key it does not admit."""
def credentials(header: bytes) -> tuple[str, bytes] | None:
    """(user, password) of an HTTP or gRPC Authorization value (Basic or Bearer)."""
def peer_text(peer: object) -> str:
    """A transport's peername as ACL LOG's addr= writes it."""
def is_local_peer(peername: Any) -> bool:
    """Redis's islocalClient: a Unix socket, 127.0.0.1 or ::1."""
LOG_VERBOSE: int

class Command:
    acl_id: int
    has_channels: bool
    @property
    def name(self) -> str: ...
    @property
    def arity(self) -> int: ...
    @property
    def flags(self) -> tuple[str, ...]: ...
    @property
    def handler(self) -> Callable[..., Any] | None: ...
    @property
    def first_key(self) -> int: ...
    @property
    def last_key(self) -> int: ...
    @property
    def key_step(self) -> int: ...
    @property
    def fast(self) -> int: ...
    @property
    def subcommands(self) -> dict[bytes, Command]: ...
    @property
    def doc(self) -> dict[str, Any]: ...
    @property
    def acl_categories(self) -> tuple[str, ...]: ...
    @property
    def no_auth(self) -> bool: ...
    @property
    def no_multi(self) -> bool: ...
    @property
    def is_write(self) -> bool: ...
    @property
    def replica_peeks(self) -> bool: ...
    @property
    def when_subscribed(self) -> bool: ...
    @property
    def not_queued(self) -> bool: ...
    calls: int
    nsec: int
    failed_calls: int
    rejected_calls: int

    def __init__(self, name: str, arity: int, flags: Iterable[str] = (),
                 handler: Callable[..., Any] | None = None, *, first_key: int = 0,
                 last_key: int = 0, key_step: int = 0, fast: int = ...,
                 subcommands: Iterable[Command] | None = None,
                 doc: dict[str, Any] | None = None, acl_categories: Iterable[str] = (),
                 replica_peeks: bool = False, when_subscribed: bool = False) -> None: ...
    def check_arity(self, argc: int) -> bool: ...
    @property
    def usec(self) -> int: ...
    def reset_stats(self) -> None: ...
    def record(self, ns: int) -> None: ...
    def latency_buckets(self) -> list[int]: ...

class Awaited:
    """A reply that waits on other nodes: the coroutine's return value is
    the reply; the connection holds its later commands meanwhile."""

    coro: Coroutine[Any, Any, Any]
    reply: Any

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None: ...
    def begin(self, wake: Callable[[], None]) -> None: ...
    def advance(self, budget_s: float) -> bool: ...
    def finish(self) -> Any: ...

class ServerCore:
    store: BucketStore
    rules: RuleEngine
    clock: Clock
    commands: dict[bytes, Command]
    requirepass: bytes | None
    default_user: Any
    auth_required: bool
    protected_refusal: bytes | None
    query_buffer_limit: int
    output_hard_limit: int
    output_soft_limit: int
    output_soft_seconds: float
    pubsub_hard_limit: int
    pubsub_soft_limit: int
    pubsub_soft_seconds: float
    maxclients: int
    budget: list[Sized]
    handshaking: int
    clients: dict[int, Connection]
    next_client_id: int
    total_commands: int
    total_connections: int
    rejected_connections: int
    total_error_replies: int
    protocol_errors: int
    error_counts: dict[str, int]
    net_input_bytes: int
    net_output_bytes: int
    readonly: bool
    app: Any
    log: logging.Logger
    max_bulk_len: int
    max_multibulk_len: int
    cluster_routing: bool
    @property
    def load_meter(self) -> LoadMeter: ...
    def drain_held(self) -> None:
        """Serves held-back connections for at most a turn's budget."""
    def shed_rules(self, nums: list[int], asked: int, fallback: int
                   ) -> tuple[int, int, int, int, int] | None:
        """The shed reply of a check of these rules, when the node sheds it now."""
    @property
    def observers(self) -> int: ...
    @property
    def monitors(self) -> dict[int, Connection]: ...
    @property
    def watched_keys(self) -> dict[bytes, dict[int, Connection]]: ...
    def full(self) -> bool:
        """Whether maxclients connections are open, all fronts and TLS handshakes together."""
    def refuses(self, transport: asyncio.BaseTransport) -> bool:
        """Whether connection_made turns this (non-TLS) connection away."""
    def touch_keys(self, keys: Iterable[bytes]) -> None: ...
    def touch_all_watched(self) -> None: ...

    def __init__(self, store: BucketStore, rules: RuleEngine, commands: dict[bytes, Command],
                 *, requirepass: bytes | None = None, max_bulk_len: int = ...,
                 max_multibulk_len: int = ..., query_buffer_limit: int = ...,
                 output_hard_limit: int = ..., output_soft_limit: int = ...,
                 output_soft_seconds: float = 60.0, maxclients: int = 10000, app: Any = None,
                 log: logging.Logger | None = None) -> None: ...
    def set_routing(self, served: Sequence[int] | None, shard_of_slot: Sequence[int] | None,
                    moved_to: list[str | None] | None) -> None:
        """Cluster routing per slot (None for all: standalone)."""
    def route_error(self, key: bytes) -> str | None: ...
    def serves_slot(self, slot: int) -> bool:
        """Whether a keyed command for slot runs here."""
    @property
    def paused(self) -> bool: ...
    def pause_clients(self) -> None:
        """No client command runs from now on (a takeover's flip)."""
    def resume_clients(self) -> None:
        """Ends the pause; the connections run what they read meanwhile."""

class Connection:
    """One client connection; an asyncio protocol (it has the callbacks,
    though it is not a subclass of asyncio.Protocol)."""

    @property
    def core(self) -> ServerCore: ...
    @property
    def id(self) -> int: ...
    @property
    def priority(self) -> int:
        """The priority its checks ask for (or its user's): its reading class."""
    def priorities(self, asked: int | None) -> tuple[int, int]:
        """(asked, at most its user's, or -1; the fallback) of a check."""
    proto: int
    authenticated: bool
    close_after_reply: bool
    name: Any
    lib_name: Any
    lib_ver: Any
    @property
    def addr(self) -> str: ...
    @property
    def laddr(self) -> str: ...
    @property
    def created(self) -> float: ...
    @property
    def last_interaction(self) -> float: ...
    multi_queue: list[Any] | None
    last_subcommand: str | None
    replica: Any
    replica_port: int
    pubsub_channels: dict[bytes, None] | None
    pubsub_patterns: dict[bytes, None] | None
    subscribed: bool
    pubsub_bytes: int
    reply_mode: int
    @property
    def monitoring(self) -> bool: ...
    @property
    def watching(self) -> dict[bytes, None] | None: ...
    @property
    def watch_dirty(self) -> bool: ...
    @property
    def watched_count(self) -> int: ...
    def start_monitor(self) -> None: ...
    def stop_monitor(self) -> None: ...
    def watch(self, keys: Iterable[bytes]) -> None: ...
    def unwatch(self) -> None: ...
    @property
    def reply_pending(self) -> bool:
        """A sliced or awaited reply is being made (not at a command boundary)."""
    def export_state(self) -> dict[str, Any]:
        """What a takeover passes: the client's settings, subscriptions and unrun input."""
    def restore_state(self, state: dict[str, Any], user: Any) -> None:
        """export_state()'s state on a new connection, before it is made."""
    @property
    def query_buffer_free(self) -> int: ...
    @property
    def argv_memory(self) -> int: ...
    @property
    def multi_memory(self) -> int: ...
    @property
    def user(self) -> Any: ...
    @property
    def transport(self) -> asyncio.Transport | None: ...

    def __init__(self, core: ServerCore) -> None: ...
    def set_user(self, user: Any, authenticated: bool) -> None: ...
    def connection_made(self, transport: asyncio.BaseTransport) -> None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...
    def eof_received(self) -> bool | None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...
    def data_received(self, data: bytes) -> None: ...
    def next_turn(self) -> None: ...
    def release_input(self) -> None: ...
    def run_slices(self) -> None: ...
    def abort(self) -> None: ...
    def close(self) -> None: ...
    def send(self, data: bytes) -> None: ...
    def push(self, frame: bytes) -> bool: ...
    def cron(self) -> None: ...
    @property
    def is_closed(self) -> bool: ...
    @property
    def query_buffer_len(self) -> int: ...
    @property
    def input_memory(self) -> int: ...
    @property
    def output_buffer_len(self) -> int: ...
    @property
    def in_multi(self) -> bool: ...
    @property
    def last_command(self) -> str: ...
