"""Type stubs for the compiled core (fastlimit/_core.pyx): the objects
users meet through ``fastlimit`` (Decision, Clock, BucketStore)."""

from typing import Any

class Decision:
    """One check's outcome, in the units of ``CL.CHECK``'s reply."""

    allowed: bool
    limit: int
    remaining: int
    retry_after_ms: int
    reset_after_ms: int
    source: str

    def __init__(self, allowed: bool, limit: int, remaining: int, retry_after_ms: int,
                 reset_after_ms: int, source: str = "server") -> None: ...
    @classmethod
    def from_reply(cls, reply: Any, source: str = "server") -> Decision:
        """From the five integers of a CL.CHECK / CL.LIMIT reply; TypeError
        or ValueError if it is not that."""
    def replace(self, **changes: Any) -> Decision:
        """A copy with some fields changed."""
    def as_tuple(self) -> tuple[bool, int, int, int, int, str]:
        """(allowed, limit, remaining, retry_after_ms, reset_after_ms, source)."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class Clock:
    """Server time in integer milliseconds: the wall clock, or a manual one
    that moves only when told (tests)."""

    manual: bool

    def __init__(self, manual: bool = False, start_ms: int = 0) -> None: ...
    def now(self) -> int:
        """Server time in integer milliseconds."""
    def set(self, ms: int) -> None:
        """Sets a manual clock (ValueError on the wall clock)."""
    def advance(self, ms: int) -> None:
        """Moves a manual clock forward by ms (ValueError on the wall clock)."""

OOM_ERROR: str
POLICIES: dict[str, int]


class OutOfMemory(MemoryError):
    """A new bucket refused under maxmemory; str() is Redis's OOM text."""


class MemoryBound:
    """maxmemory over the tables of the stores attached to it."""

    def configure(self, limit: int, policy: str, samples: int) -> None: ...
    def evict(self, now_ms: int, budget_ms: float = 1.0) -> int:
        """Evicts until under the limit or budget_ms passed, ranking
        buckets as they stand at now_ms; how many."""
    @property
    def limit(self) -> int: ...
    @property
    def used(self) -> int:
        """Bytes of the attached tables, compared with the limit."""
    @property
    def evicted(self) -> int: ...


class BucketStore:
    """Token buckets in sharded C tables, with the server's arithmetic."""

    clock: Clock

    def __init__(self, shards: int = 256, clock: Clock | None = None,
                 seed: bytes | None = None) -> None: ...
    def set_bound(self, bound: MemoryBound | None) -> None: ...
    def check(self, key: bytes, capacity: int, refill_per_sec: int, cost: int = 1,
              period_ms: int = 1000, now_ms: int | None = None
              ) -> tuple[int, int, int, int, int]:
        """Spends cost tokens of key's bucket if it holds them, as CL.CHECK:
        (allowed, limit, remaining, retry_after_ms, reset_after_ms)."""
    def decide(self, key: bytes, capacity: int, refill_per_sec: int, cost: int = 1,
               period_ms: int = 1000, source: str = "local") -> Decision:
        """check(), as a Decision."""
    def reset(self, key: bytes) -> bool:
        """Forgets a bucket; True if there was one."""
    def clear(self) -> None:
        """Forgets every bucket."""
    def sweep(self, now_ms: int | None = None, budget_ms: float = 1.0) -> tuple[int, int]:
        """Drops buckets that have refilled, for at most budget_ms:
        (removed, slots scanned)."""
    def __len__(self) -> int: ...
    @property
    def memory_bytes(self) -> int:
        """Bytes the tables hold (about 55 per bucket)."""
    @property
    def expired_total(self) -> int:
        """Buckets the sweep has dropped since start."""
    @property
    def shards(self) -> int:
        """How many tables the buckets are spread over."""
    # cluster slots: the key a client routes by decides a bucket's slot
    def count_in_slot(self, slot: int, now_ms: int | None = None) -> int:
        """Live buckets of a hash slot (scans the whole table)."""
    def keys_in_slot(self, keys: SlotKeys, slot: int, now_ms: int | None = None) -> None:
        """Adds the routing keys of a slot's live buckets to keys."""
    def export_slots(self, cursor: SlotCursor, budget_ms: float = 1.0,
                     max_bytes: int = 1048576) -> list[bytes]:
        """The next buckets of the cursor's slots, as snapshot sections."""
    def delete_slots(self, cursor: SlotCursor, budget_ms: float = 1.0) -> int:
        """Deletes the next buckets of the cursor's slots; how many."""
    def filter_section(self, mask: bytes, name: bytes, value_size: int, data: Any,
                       records: int) -> list[bytes]:
        """A drained section's records in mask's slots, as a section."""
    def __getattr__(self, name: str) -> Any: ...  # the replication and snapshot internals

class SlotKeys:
    """Up to limit distinct routing keys (CLUSTER GETKEYSINSLOT)."""

    def __init__(self, limit: int) -> None: ...
    def keys(self) -> list[bytes]: ...

class SlotCursor:
    """Where an export or deletion of the slots in mask (16384 bytes, non-zero
    = in) stands; resumes there."""

    table: bytes | None
    finished: set[bytes | None]
    records: int

    def __init__(self, mask: bytes) -> None: ...
    @property
    def done(self) -> bool: ...

def checked_slot(slot: int) -> int: ...
