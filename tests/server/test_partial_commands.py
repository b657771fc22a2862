"""Commands that arrive in pieces, against a real server over sockets.

A partial command resumes where its parsing stopped (as Redis's
processMultibulkBuffer), so a client trickling bytes into a huge command
costs the server O(new bytes), not a re-parse of everything received so
far.  Splitting a command or a pipeline at any byte gives the replies of
one write; CLIENT LIST's qbuf (the unparsed bytes) tells the test when the
server has read a piece, so each split really is two reads.  INFO memory
counts the client buffers.

Bounded: loads are counted and run for about 2 s at most; CPU comes from
/proc/<pid>/stat.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time

import pytest

from fastlimit._resp import parse
from wire import TIMEOUT, Wire, command, wait_until

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK     # utime + stime


def qbuf(admin: Wire, client_id: int) -> int:
    line = admin.call("CLIENT", "LIST", "ID", client_id)
    return int(re.search(rb" qbuf=(\d+) ", line).group(1))


def client_id(w: Wire) -> int:
    return int(w.call("CLIENT", "ID")[1:-2])


@pytest.mark.untraced
def test_partial_command_is_not_reparsed_from_the_start(make_server):
    srv = make_server()
    pid = srv.proc.pid
    admin = Wire.to(srv.port)
    slow = Wire.to(srv.port)
    slow_id = client_id(slow)
    head = b"*300000\r\n" + b"$1\r\na\r\n" * 200000        # 200k of 300k args
    slow.send(head)
    wait_until(lambda: qbuf(admin, slow_id) == len(head), what="the server to read the head")
    tail = b"$1\r\na\r\n" * 10000
    stop = threading.Event()
    sent = []

    def trickle():
        i = 0
        while not stop.is_set() and i < len(tail):
            slow.sock.send(tail[i:i + 1])
            i += 1
            time.sleep(0.0005)
        sent.append(i)

    t0, c0 = time.monotonic(), cpu_seconds(pid)
    thread = threading.Thread(target=trickle)
    thread.start()
    pings = 0
    while time.monotonic() < t0 + 2.0:
        assert admin.call_raw(b"PING\r\n") == b"+PONG\r\n"
        pings += 1
        time.sleep(0.01)
    stop.set()
    thread.join(TIMEOUT)
    used = (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
    assert sent[0] > 500                      # the trickle really ran
    # before: every byte re-parsed all 200k arguments (100% CPU)
    assert used < 0.30, f"server CPU {used:.0%} while {sent[0]} bytes trickled in"
    wait_until(lambda: qbuf(admin, slow_id) == len(head) + sent[0], what="all bytes read")
    slow.close()
    admin.close()


def single_commands(key: bytes) -> list[bytes]:
    return [
        command("CL.CHECK", key, 5, 2, "COST", 3),
        b"CL.CHECK " + key + b" 5 2\r\n",
        command("PING"),
        command("ECHO", b"a\r\n*1\r\n$4\r\n" + bytes(range(250, 256))),
        command("ECHO", b""),
        b'ECHO "q \\"x\\"" \'y z\'\r\n',
        b"PING\n",
        command("CL.CHECK", key, "x", 2),       # an error reply, not a protocol error
    ]


def test_every_command_split_at_every_byte_replies_as_in_one_write(server, r):
    admin = Wire.to(server.port)
    w = Wire.to(server.port)
    wid = client_id(w)
    for n, template in enumerate(single_commands(b"k:000000")):
        for k in range(1, len(template)):
            key = b"k:%06d" % (n * 1000 + k)
            frame = single_commands(key)[n]
            one = single_commands(b"o:%06d" % (n * 1000 + k))[n]
            expected = w.call_raw(one)
            w.send(frame[:k])
            wait_until(lambda: qbuf(admin, wid) == k, what=f"{k} bytes of {frame!r}",
                       interval=0.001)
            w.send(frame[k:])
            assert w.read_reply() == expected, (frame, k)
    assert w.is_open(0.05) and w.buf == b""
    w.close()
    admin.close()


def pipeline(rng: random.Random, tag: int) -> bytes:
    frames = []
    for i in range(rng.randrange(2, 30)):
        key = b"p:%d:%d" % (tag, rng.randrange(5))
        frames.append(rng.choice([
            command("CL.CHECK", key, 10, 1, "COST", rng.randrange(3)),
            b"CL.CHECK " + key + b" 10 1\r\n",
            command("ECHO", b"v" * rng.choice((0, 1, 100, 20000, 70000))),
            command("PING", *[b"x"] * rng.randrange(0, 2)),
            b"PING\r\n", b"\r\n", b"*0\r\n",
            command("ECHO", rng.randbytes(rng.randrange(1, 50))),
        ]))
    return b"".join(frames)


def test_pipelines_split_at_random_bytes_reply_as_in_one_write(server, r):
    rng = random.Random(20261201)
    admin = Wire.to(server.port)
    w = Wire.to(server.port)
    wid = client_id(w)
    for tag in range(40):
        data = pipeline(rng, tag)
        expected_w = Wire.to(server.port)
        expected_w.send(data.replace(b"p:%d:" % tag, b"q:%d:" % tag))
        commands = parse(data)[0]
        expected = b"".join(expected_w.read_reply() for _ in commands)
        expected_w.close()
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randrange(1, 12))))
        for a, b in zip([0] + cuts, cuts + [len(data)]):
            w.send(data[a:b])
            used = parse(data[:b])[1]
            wait_until(lambda: qbuf(admin, wid) == b - used, interval=0.001,
                       what=f"the server to read up to byte {b}")
        got = b"".join(w.read_reply() for _ in commands)
        assert got == expected, (tag, cuts)
    w.close()
    admin.close()


def info_memory(w: Wire) -> dict:
    text = w.call("INFO", "memory").decode()
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def test_client_query_buffers_show_in_info_memory(make_server):
    srv = make_server()
    admin = Wire.to(srv.port)
    base = int(info_memory(admin)["mem_clients_normal"])
    big = Wire.to(srv.port)
    big.send(command("ECHO", b"b" * 3_000_000)[:2_000_000])      # a bulk still arriving
    wait_until(lambda: int(info_memory(admin)["mem_clients_normal"]) >= base + 2_000_000,
               what="the partial bulk to count in mem_clients_normal")
    big.close()
    wait_until(lambda: int(info_memory(admin)["mem_clients_normal"]) < base + 100_000,
               what="the memory to be given back when the client leaves")
    admin.close()


def test_a_huge_command_gives_its_argv_back_once_it_has_run(make_server):
    srv = make_server()
    admin = Wire.to(srv.port)
    base = int(info_memory(admin)["mem_clients_normal"])
    w = Wire.to(srv.port)
    assert w.call("ECHO", *[b"a"] * 200_000).startswith(b"-ERR wrong number of arguments")
    # before: the 200k-entry argv (3+ MB) stayed until the next command
    assert int(info_memory(admin)["mem_clients_normal"]) < base + 200_000
    w.close()
    admin.close()
