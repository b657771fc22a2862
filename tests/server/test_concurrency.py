"""Many connections hitting one key with the clock frozen: exactly the
bucket's capacity is allowed in total, and every allowed request sees a
distinct `remaining` (no two requests spent the same tokens)."""

from __future__ import annotations

import threading

import pytest

THREADS = 50
PER_THREAD = 100


def hammer(server, key: str, capacity: int, cost: int, mode: str) -> list[list[int]]:
    clients = [server.client(protocol=2) for _ in range(THREADS)]
    for c in clients:
        c.ping()   # connect before the start line
    barrier = threading.Barrier(THREADS)
    results: list[list[list[int]]] = [[] for _ in range(THREADS)]
    errors: list[BaseException] = []

    def worker(n: int):
        c = clients[n]
        args = ("CL.CHECK", key, capacity, 1, "COST", cost)
        try:
            barrier.wait(10)
            if mode == "single":
                for _ in range(PER_THREAD):
                    results[n].append(c.execute_command(*args))
            else:
                for chunk in range(0, PER_THREAD, 25):
                    p = c.pipeline(transaction=(mode == "multi"))
                    for _ in range(25):
                        p.execute_command(*args)
                    results[n].extend(p.execute())
        except BaseException as e:   # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for c in clients:
        c.close()
    assert not errors, errors[:3]
    assert not any(t.is_alive() for t in threads)
    return [reply for rs in results for reply in rs]


@pytest.mark.parametrize("mode", ["single", "pipelined", "multi"])
def test_exactly_capacity_allowed(server, r, mode):
    replies = hammer(server, "hot", 1000, 1, mode)
    assert len(replies) == THREADS * PER_THREAD
    allowed = [x for x in replies if x[0] == 1]
    denied = [x for x in replies if x[0] == 0]
    assert len(allowed) == 1000
    assert sorted(x[2] for x in allowed) == list(range(1000))
    assert all(x == [0, 1000, 0, 1000, 1000000] for x in denied), denied[:3]
    assert r.execute_command("CL.CHECK", "hot", 1000, 1, "COST", 0) == [1, 1000, 0, 0, 1000000]


def test_exactly_capacity_allowed_with_cost_7(server, r):
    replies = hammer(server, "hot7", 1000, 7, "single")
    allowed = [x for x in replies if x[0] == 1]
    assert len(allowed) == 142          # 142 * 7 = 994 tokens; 6 left
    assert sorted(x[2] for x in allowed) == sorted(1000 - 7 * k for k in range(1, 143))
    denied = [x for x in replies if x[0] == 0]
    assert len(denied) == THREADS * PER_THREAD - 142
    # 6 tokens left, 1 more needed at 1 token/s
    assert all(x == [0, 1000, 6, 1000, 994000] for x in denied), denied[:3]


def test_asyncio_connections(server, r):
    import asyncio

    import redis.asyncio as aredis

    async def main():
        clients = [aredis.Redis(host="127.0.0.1", port=server.port, protocol=3)
                   for _ in range(THREADS)]
        try:
            async def one(c):
                return [await c.execute_command("CL.CHECK", "ahot", 500, 1)
                        for _ in range(PER_THREAD // 2)]
            out = await asyncio.gather(*(one(c) for c in clients))
        finally:
            for c in clients:
                await c.aclose()
        return [x for xs in out for x in xs]

    replies = asyncio.run(main())
    assert len(replies) == THREADS * PER_THREAD // 2
    allowed = [x for x in replies if x[0] == 1]
    assert len(allowed) == 500
    assert sorted(x[2] for x in allowed) == list(range(500))
