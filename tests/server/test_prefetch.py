"""A pipelined read's CL.CHECKs have their buckets prefetched before they
run (_protocol.pyx prefetch_checks, on tables past PREFETCH_MIN_SLOTS),
and each check then uses the hash the prefetch computed: whatever a read
holds, its replies are byte for byte those of the same commands sent one
per read (where nothing is prefetched).  In the test's process, a
Connection fed by hand, on the manual clock."""

from __future__ import annotations

import asyncio
import random

import pytest
from wire import RecordingTransport, command

from fastlimit._core import BucketStore, Clock
from fastlimit._protocol import Connection, ServerCore
from fastlimit._rules import RuleEngine
from fastlimit.server.commands.table import build_table

# 300,000 buckets per case: volume, which line tracing would make minutes
pytestmark = pytest.mark.untraced

FILLED = 300_000      # past PREFETCH_MIN_SLOTS' 2^18 slots


FILL = [b"".join(command("CL.CHECK", f"fill:{i}", 100, 1, "COST", 1 + i % 7)
                 for i in range(start, min(start + 64, FILLED))) for start in range(0, FILLED, 64)]


def filled_connection() -> tuple[Connection, RecordingTransport]:
    clock = Clock(manual=True)
    clock.set(1_000_000)
    core = ServerCore(BucketStore(clock=clock), RuleEngine(clock=clock), build_table())
    conn = Connection(core)
    transport = RecordingTransport()
    conn.connection_made(transport)
    replies(conn, transport, FILL)
    assert transport.out.count(b"*5\r\n") == FILLED
    transport.out = b""
    return conn, transport


def commands(seed: int) -> list[bytes]:
    """CL.CHECKs on filled and new keys, a key twice in one read, other
    commands, errors, split checks and MULTI between them."""
    rng = random.Random(seed)
    out = []
    for i in range(400):
        key = f"fill:{rng.randrange(FILLED)}" if rng.random() < 0.7 else f"new:{rng.randrange(50)}"
        roll = rng.random()
        if roll < 0.6:
            out.append(command(rng.choice(["CL.CHECK", "cl.check", "Cl.Check"]), key, 100, 1,
                               "COST", rng.randrange(0, 30)))
        elif roll < 0.7:
            # a sub-key names its sub-bucket (a plain key's is random)
            out.append(command("CL.CHECK", f"{key}#{rng.randrange(4)}", 100, 1, "SPLIT", 4))
        elif roll < 0.75:
            out.append(command("CL.CHECK", key, "x", 1))              # an error
        elif roll < 0.8:
            out += [command("MULTI"), command("CL.CHECK", key, 100, 1), command("EXEC")]
        elif roll < 0.85:
            out.append(command("PING"))
        else:
            out.append(command("CL.CHECK", key, 10, 1, "COST", 3))
    return out


def replies(conn: Connection, transport: RecordingTransport, reads: list[bytes]) -> bytes:
    async def feed():
        for data in reads:
            conn.data_received(data)
            await asyncio.sleep(0)
    asyncio.run(feed())
    return transport.out


@pytest.mark.parametrize("seed", range(2))
def test_a_pipelined_reads_replies_are_those_of_its_commands_one_by_one(seed):
    cmds = commands(seed)
    rng = random.Random(seed)
    reads, i = [], 0
    while i < len(cmds):       # reads of 1 to 40 commands, some cut mid-command
        j = i + rng.randrange(1, 40)
        reads.append(b"".join(cmds[i:j]))
        i = j
    data = b"".join(reads)
    cuts = sorted(rng.sample(range(1, len(data)), 30))
    ragged = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    one_by_one = replies(*filled_connection(), cmds)
    assert replies(*filled_connection(), reads) == one_by_one
    assert replies(*filled_connection(), ragged) == one_by_one
