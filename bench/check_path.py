#!/usr/bin/env python3
"""The CL.CHECK path alone, from the socket buffer to the reply, for
counting instructions: feeds N commands (16 per read, as redis-benchmark
-P 16 sends them) through one Connection with a stand-in transport.

Instruction counts do not move with the machine's noise, so this is how a
change shows that it costs the check path nothing:

    valgrind --tool=callgrind --callgrind-out-file=cg.out .venv/bin/python bench/check_path.py 32000
    callgrind_annotate --inclusive=yes cg.out | grep data_received

and divide Connection.data_received's inclusive count by N, for the build
before and after the change (``--quick`` anywhere: N is 320 unless
given, a smoke run).  With a second argument ``cluster`` the
connection routes as a cluster node serving every slot (each command's
slot is computed and looked up, nothing is redirected).  With
``maxmemory BYTES`` the tables are under that bound (default policy): a
bound far above the N buckets costs only its bookkeeping, one below them
makes each new key past it evict.  With ``existing`` the N commands go
to 1,000 keys (the buckets exist after the first thousand): the path of a
check of a stored bucket rather than of a new one.  The hot-key tracker
is on as in a server (32 counters, one check in 16 counted); with
``hotkeys-off`` it is off (each check still pays its countdown), with
``hotkeys-seed N`` its random intervals are the same on every run.  With
``limit`` the commands are CL.LIMIT <key> api against one token-bucket
rule (as CL.CHECK's numbers), the named-rules path; ``limit-split K``
splits that rule K ways.
"""

from __future__ import annotations

import asyncio
import sys

from fastlimit._core import BucketStore, Clock
from fastlimit._protocol import Connection, ServerCore
from fastlimit._rules import RuleEngine
from fastlimit.server.commands.table import build_table


class Transport:
    """Takes the replies and drops them."""

    def get_extra_info(self, name):
        return ("127.0.0.1", 1)

    def write(self, data):
        pass

    def get_write_buffer_size(self):
        return 0

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass

    def close(self):
        pass

    abort = close


KEYS = 1_000_000


def check(i: int) -> bytes:
    key = b"key:%012d" % (i * 7919 % KEYS)
    return b"*4\r\n$8\r\nCL.CHECK\r\n$%d\r\n%s\r\n$3\r\n100\r\n$2\r\n10\r\n" % (len(key), key)


def limit(i: int) -> bytes:
    key = b"key:%012d" % (i * 7919 % KEYS)
    return b"*3\r\n$8\r\nCL.LIMIT\r\n$%d\r\n%s\r\n$3\r\napi\r\n" % (len(key), key)


def define_rule(engine, split: int) -> None:
    from fastlimit.rules.registry import RuleRegistry
    rule = {"match": {"resource": "api"}, "capacity": 100, "refill_per_second": 10}
    if split > 1:
        rule["split"] = split
    registry = RuleRegistry(engine)
    registry.start(load_file=False)
    registry.set("api", rule)


async def feed(conn: Connection, reads: list[bytes]) -> None:
    for i, data in enumerate(reads):
        conn.data_received(data)
        if i % 16 == 15:
            await asyncio.sleep(0)     # a loop turn, as between reads


def main() -> None:
    global KEYS
    # --quick: a smoke run (the test suite's), 320 commands unless N is given
    argv = [a for a in sys.argv if a != "--quick"]
    n = int(argv[1]) if len(argv) > 1 else 320 if "--quick" in sys.argv else 32000
    if "existing" in argv[2:]:
        KEYS = 1000
    clock = Clock(manual=True)
    store, engine = BucketStore(clock=clock), RuleEngine(clock=clock)
    core = ServerCore(store, engine, build_table())
    if "cluster" in argv[2:]:
        core.set_routing(b"\x01" * 16384, [0] * 16384, ["127.0.0.1:1"])
    if "maxmemory" in argv[2:]:
        from fastlimit._core import MemoryBound  # not in builds before it
        bound = MemoryBound()
        bound.configure(int(argv[argv.index("maxmemory") + 1]), "nearest-full", 5)
        store.set_bound(bound)
        engine.set_bound(bound)
    if "hotkeys-off" in argv[2:]:
        core.hotkeys.configure(0, 16, 0, 0)       # the tracker off: its countdown never ends
    if "hotkeys-seed" in argv[2:]:
        # the same sampled checks on every run (the default seed is the time)
        core.hotkeys.configure(32, 16, 10_000, 0, int(argv[argv.index("hotkeys-seed") + 1]))
    command, name = check, b"cl.check"
    if "limit" in argv[2:] or "limit-split" in argv[2:]:
        split = int(argv[argv.index("limit-split") + 1]) \
            if "limit-split" in argv[2:] else 1
        define_rule(engine, split)
        command, name = limit, b"cl.limit"
    conn = Connection(core)
    conn.connection_made(Transport())
    reads = [b"".join(command(j) for j in range(i, i + 16)) for i in range(0, n, 16)]
    asyncio.run(feed(conn, reads))
    print(f"{core.commands[name].calls} {name.decode().upper()} run", file=sys.stderr)


if __name__ == "__main__":
    main()
