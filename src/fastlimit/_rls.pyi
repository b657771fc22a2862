from collections.abc import Iterator
from typing import Any

from fastlimit._load import LoadMeter
from fastlimit._rules import RuleEngine

COUNTER_LIMIT: int
PRIORITY_ENTRY: bytes
SHED_HEADER: tuple[bytes, bytes]
READONLY: str
NEAR_LIMIT_RATIO: float
LIMIT_STAT_FIELDS: tuple[str, ...]
DOMAIN_STAT_FIELDS: tuple[str, ...]
ALGORITHMS: tuple[str, ...]

class RlsError(Exception): ...

class RlsHome(Exception):
    home: int
    def __init__(self, home: int) -> None: ...

def walk_limits(root: Any) -> Iterator[Any]: ...
def walk_nodes(root: Any) -> Iterator[Any]: ...

class Compiled:
    counters: list[tuple[tuple, Any, str]]
    stat_keys: list[tuple[bytes, str, int]]
    domain_names: list[bytes]
    has_home: bool
    def __init__(self, config: Any, regions: Any = ...) -> None: ...
    def set_numbers(self, num_by_counter: dict[tuple, int]) -> None: ...
    def carry_from(self, old: Compiled) -> None: ...
    def take_stats(self, old: Compiled) -> None: ...
    def limit_stat_rows(self, first: int | None = ...
                        ) -> list[tuple[tuple[bytes, str, int], tuple[int, ...]]]: ...
    def domain_stat_items(self) -> list[tuple[bytes, dict[str, int]]]: ...

class Decider:
    service: Any
    load: LoadMeter | None
    read_only: Any
    response_headers: bool
    shadow_mode: bool
    home_local: bool
    region_here: int
    region_count: int
    unknown_domain: int
    global_shadow_mode: int
    def __init__(self, engine: RuleEngine, service: Any) -> None: ...
    @property
    def compiled_config(self) -> Compiled: ...
    def install(self, compiled: Compiled) -> Compiled: ...
    def should_rate_limit(self, domain: bytes, descriptors: list,
                          hits_addend: int) -> tuple[int, list, list]: ...
    def stats_info(self) -> dict[str, dict[str, int]]: ...
