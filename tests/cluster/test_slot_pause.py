"""A paused slot (the last step of a slot move): its commands wait, with
the commands after them on the same connection, and are answered in
order once the pause ends: run where the slot stayed, MOVED where it
moved.  The connection runs in process on a recording transport, as
bench/check_path.py drives it."""

from __future__ import annotations

import asyncio

from wire import RecordingTransport

from fastlimit._cluster import keyslot
from fastlimit._core import BucketStore, Clock
from fastlimit._protocol import Connection, ServerCore
from fastlimit._rules import RuleEngine
from fastlimit.server.commands.table import build_table

A, B = b"{a}", b"{b}"          # different slots


def command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def mask(*keys: bytes) -> bytes:
    m = bytearray(16384)
    for k in keys:
        m[keyslot(k)] = 1
    return bytes(m)


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def node():
    clock = Clock(manual=True)
    core = ServerCore(BucketStore(clock=clock), RuleEngine(clock=clock), build_table())
    core.set_routing(b"\x01" * 16384, [0] * 16384, ["127.0.0.1:7001"])
    conn = Connection(core)
    transport = RecordingTransport()
    conn.connection_made(transport)
    return core, conn, transport


def test_a_paused_slots_commands_wait_in_order_then_run():
    async def run():
        core, conn, transport = node()
        assert core.pause_slots(mask(A)) == 1
        conn.data_received(command(b"PING", b"first") + command(b"CL.CHECK", A, b"5", b"1")
                           + command(b"CL.CHECK", B, b"5", b"1") + command(b"PING", b"last"))
        await turns()
        assert transport.out == b"$5\r\nfirst\r\n"      # A waits, and what follows it
        assert not transport.reading and core.slot_waiting_clients == 1
        core.resume_slots()
        await turns()
        assert transport.out == (b"$5\r\nfirst\r\n" + b"*5\r\n:1\r\n:5\r\n:4\r\n:0\r\n:1000\r\n"
                                 + b"*5\r\n:1\r\n:5\r\n:4\r\n:0\r\n:1000\r\n$4\r\nlast\r\n")
        assert transport.reading and core.slot_waiting_clients == 0
    asyncio.run(run())


def test_a_command_waiting_on_a_slot_that_moved_gets_moved():
    async def run():
        core, conn, transport = node()
        core.pause_slots(mask(A))
        conn.data_received(command(b"CL.CHECK", A, b"5", b"1") + command(b"PING"))
        await turns()
        assert transport.out == b""
        served = bytearray(b"\x01" * 16384)
        served[keyslot(A)] = 0                    # the flip: A's slot is the other shard's
        core.set_routing(bytes(served), [0] * 16384, ["127.0.0.1:7001"])
        core.resume_slots()
        await turns()
        assert transport.out == b"-MOVED %d 127.0.0.1:7001\r\n+PONG\r\n" % keyslot(A)
    asyncio.run(run())


def test_a_pause_outlives_a_routing_change_for_slots_still_served():
    async def run():
        core, conn, transport = node()
        core.pause_slots(mask(A))
        core.set_routing(b"\x01" * 16384, [0] * 16384, ["127.0.0.1:7001"])
        conn.data_received(command(b"CL.CHECK", A, b"5", b"1"))
        await turns()
        assert transport.out == b""
        core.resume_slots()
        await turns()
        assert transport.out.startswith(b"*5\r\n:1\r\n")
    asyncio.run(run())
