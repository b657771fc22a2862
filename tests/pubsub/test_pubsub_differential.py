"""Pub/Sub side by side with a real redis-server 7.0: the same commands
sent raw to both, the raw reply bytes compared (RESP2 and RESP3), and
Redis's glob (stringmatchlen) compared on a table of tricky patterns and
on seeded random ones.

Sequences avoid what Redis answers in its hash tables' order (UNSUBSCRIBE
with no argument over several channels, several patterns matching one
PUBLISH, PUBSUB CHANNELS), or compare those as sets."""

from __future__ import annotations

import random
import time

import pytest
from wire import TIMEOUT, Wire, command

# Redis answers "unknown command" for commands fastlimit lacks and the
# reverse, so the refusals use commands both have.
SEQUENCE = [
    ("a", ("SUBSCRIBE", "ch1", "ch2")),
    ("a", ("SUBSCRIBE", "ch1")),                      # held already: the count stays
    ("a", ("PSUBSCRIBE", "c*")),
    ("a", ("PSUBSCRIBE", "c*")),
    ("b", ("PUBLISH", "ch1", "hello")),               # 2 receivers: channel and pattern
    ("a", None),                                      # a reads the message and pmessage
    ("b", ("PUBLISH", "other", "x")),
    ("a", ("PING",)),
    ("a", ("PING", "payload")),
    ("a", ("PING", "a", "b")),
    ("a", ("ECHO", "x")),
    ("a", ("DBSIZE",)),
    ("a", ("MULTI",)),
    ("a", ("HELLO", "3")),
    ("a", ("CLIENT", "LIST")),
    ("a", ("CLIENT", "NOSUCH")),
    ("a", ("CLIENT", "SETNAME")),
    ("a", ("CONFIG", "GET", "hz")),
    ("a", ("NOSUCHCOMMAND",)),
    ("a", ("SUBSCRIBE",)),
    ("a", ("UNSUBSCRIBE", "ch1", "never")),
    ("a", ("PUNSUBSCRIBE",)),
    ("a", ("PUNSUBSCRIBE",)),                         # none held: one frame, null name
    ("a", ("UNSUBSCRIBE",)),
    ("a", ("UNSUBSCRIBE",)),
    ("a", ("PING",)),                                 # out of subscribed mode: +PONG
    ("b", ("PUBSUB", "NUMSUB", "ch1", "ch2")),
    ("b", ("PUBSUB", "NUMSUB")),
    ("b", ("PUBSUB", "NUMPAT")),
    ("b", ("PUBSUB", "CHANNELS", "a", "b")),
    ("b", ("PUBSUB", "NOSUCH")),
    ("b", ("PUBLISH", "ch1")),
    ("a", ("SUBSCRIBE", "y")),
    ("a", ("QUIT",)),
]

RESP3_SEQUENCE = [
    ("a", ("HELLO", "3")),
    ("a", ("UNSUBSCRIBE",)),                          # none held: push with a RESP3 null
    ("a", ("PUNSUBSCRIBE",)),
    ("a", ("SUBSCRIBE", "z")),
    ("a", ("PSUBSCRIBE", "z?")),
    ("a", ("PING",)),                                 # RESP3 has no subscribed mode
    ("a", ("ECHO", "any command")),
    ("b", ("PUBLISH", "zz", "to the pattern")),
    ("a", None),
    ("a", ("PUBLISH", "z", "to myself")),             # the push comes before the reply
    ("a", ("UNSUBSCRIBE", "z", "q")),
    ("a", ("PUNSUBSCRIBE",)),
    ("a", ("SUBSCRIBE", "y")),
    ("a", ("HELLO", "2")),                            # back to RESP2: now gated
    ("a", ("PING",)),
    ("a", ("DBSIZE",)),
    ("a", ("RESET",)),                                # drops the subscriptions
    ("a", ("PING",)),
    ("b", ("PUBLISH", "y", "nobody")),
    ("b", ("PUBSUB", "NUMSUB", "y")),
]


def settle(w: Wire, wait: float = 0.15) -> bytes:
    """What the server sent for one step: its first bytes, however late (every
    step here has a reply or a push), then whatever follows within wait
    (pushes have no count)."""
    w.fill(time.monotonic() + TIMEOUT)
    deadline = time.monotonic() + wait
    while w.fill(deadline):
        pass
    out, w.buf = w.buf, b""
    return out


def hello_reply(data: bytes) -> bool:
    return data.startswith((b"%7\r\n$6\r\nserver", b"%8\r\n$6\r\nserver",
                            b"*14\r\n$6\r\nserver", b"*16\r\n$6\r\nserver"))


def run(port: int, sequence) -> list[bytes]:
    replies = []
    with Wire.to(port) as a, Wire.to(port) as b:
        wires = {"a": a, "b": b}
        for who, cmd in sequence:
            if cmd is not None:
                wires[who].send(command(*cmd))
            got = settle(wires[who])
            # HELLO names the server: only its shape is compared
            replies.append(b"<hello>" if hello_reply(got) else got)
    return replies


@pytest.mark.parametrize("sequence", [SEQUENCE, RESP3_SEQUENCE], ids=["resp2", "resp3"])
def test_pubsub_sequence_replies_are_redis_bytes(server, redis_server, sequence):
    ours, theirs = run(server.port, sequence), run(redis_server.port, sequence)
    for (who, cmd), mine, redis in zip(sequence, ours, theirs, strict=True):
        assert mine == redis, f"{who} {cmd}: fastlimit {mine!r} != redis {redis!r}"


def test_subscribed_mode_refusal_is_redis_text(server, redis_server):
    for port in (server.port, redis_server.port):
        with Wire.to(port) as w:
            w.send(command("SUBSCRIBE", "c"))
            w.read_reply()
            assert w.call("ECHO", "x") == (
                b"-ERR Can't execute 'echo': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING "
                b"/ QUIT / RESET are allowed in this context\r\n")
            assert w.call("CONFIG", "GET", "hz").startswith(b"-ERR Can't execute 'config|get'")
            assert w.call("PING") == b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"


def decode(data: bytes, pos: int = 0):
    """A RESP2 reply as Python values, and where it ends."""
    eol = data.index(b"\r\n", pos)
    kind, head, pos = data[pos:pos + 1], data[pos + 1:eol], eol + 2
    if kind == b"*":
        items = []
        for _ in range(int(head)):
            item, pos = decode(data, pos)
            items.append(item)
        return items, pos
    if kind == b"$":
        return data[pos:pos + int(head)], pos + int(head) + 2
    return (int(head) if kind == b":" else head), pos


def command_entry(port: int, name: str) -> tuple:
    """A COMMAND INFO entry with its flag and category sets sorted (both
    servers send sets, in their own order)."""
    with Wire.to(port) as w:
        entry = decode(w.call("COMMAND", "INFO", name))[0][0]
    subs = {s[0]: (s[1], sorted(s[2]), sorted(s[6])) for s in entry[9]}
    return entry[0], entry[1], sorted(entry[2]), entry[3:6], sorted(entry[6]), subs


@pytest.mark.parametrize("name", ["subscribe", "unsubscribe", "psubscribe", "punsubscribe",
                                  "publish"])
def test_command_info_of_pubsub_commands_is_redis_entries(server, redis_server, name):
    assert command_entry(server.port, name) == command_entry(redis_server.port, name)


def test_pubsub_container_lists_its_subcommands_with_redis_flags(server, redis_server):
    ours, theirs = command_entry(server.port, "pubsub"), command_entry(redis_server.port, "pubsub")
    assert ours[:5] == theirs[:5]
    for name in (b"pubsub|channels", b"pubsub|numsub", b"pubsub|numpat"):
        assert ours[5][name] == theirs[5][name], name


def redis_client(port):
    import redis
    return redis.Redis(port=port, protocol=2)


# ---- the glob --------------------------------------------------------------------

CHANNELS = [b"", b"a", b"b", b"ab", b"abc", b"aXc", b"a*c", b"a?c", b"a[c", b"a]c", b"a\\c",
            b"a-c", b"a^c", b"^", b"]", b"[", b"-", b"\\", b"*", b"?", b"hello", b"hallo",
            b"hxllo", b"heeeello", b"h\xffllo", b"\xff", b"\x80", b"\x7f", b"\x00", b"a\x00c",
            b"A", b"Z", b"z", b"aaaa", b"aaab", b"news.tech", b"news.", b"__sentinel__:hello"]

PATTERNS = [b"", b"*", b"**", b"?", b"??", b"a*", b"*c", b"a*c", b"a?c", b"a\\*c", b"a\\?c",
            b"a\\", b"\\", b"\\\\", b"a\\\\c", b"[abc]", b"[^abc]", b"[a-c]", b"[c-a]", b"[]",
            b"[^]", b"[]]", b"[]a]", b"a[]]c", b"a[]-]c", b"[a-]", b"[a-]c]", b"[-a]",
            b"a[-]c", b"[\\]]", b"a[\\]]c", b"a[\\\\]c", b"[a", b"a[", b"a[b", b"a[^", b"[^a",
            b"[\\", b"a[x-z\\", b"[!a]", b"[[]", b"a[[]c", b"a[*]c", b"a[?]c", b"h[ae]llo",
            b"h[^e]llo", b"h[a-b]llo", b"h*llo", b"h?llo", b"*llo", b"h\\*llo", b"[\x80-\xff]",
            b"[\x00-\x7f]", b"[a-\xff]", b"[\xff-a]", b"h[\x7f-\x81]llo", b"[^\x80-\xff]",
            b"[A-z]", b"[Z-a]", b"a*a*a*b", b"*a*", b"*?", b"?*", b"*?*", b"news.*",
            b"__sentinel__:*", b"*\x00*", b"a\x00c", b"[\x00]", b"*[", b"*]", b"***c", b"a**",
            b"[a-c-e]", b"[a-c-]", b"[--/]", b"[\\-]", b"[^-]", b"[^]]", b"[^\\]]", b"\\[a]"]


def channels_matching(port: int, patterns) -> list[set[bytes]]:
    with Wire.to(port) as sub:
        sub.send(command("SUBSCRIBE", *CHANNELS))
        settle(sub, 0.3)
        client = redis_client(port)
        return [set(client.execute_command("PUBSUB", "CHANNELS", p)) for p in patterns]


def assert_same_matches(server, redis_server, patterns) -> None:
    ours = channels_matching(server.port, patterns)
    theirs = channels_matching(redis_server.port, patterns)
    assert sum(map(len, theirs)) > 100      # the patterns do match things
    for pattern, mine, redis in zip(patterns, ours, theirs, strict=True):
        assert mine == redis, f"{pattern!r}: fastlimit {sorted(mine)} != redis {sorted(redis)}"


def test_glob_table_matches_redis_stringmatchlen(server, redis_server):
    assert_same_matches(server, redis_server, PATTERNS)


def test_glob_on_random_patterns_matches_redis(server, redis_server):
    rng = random.Random(20261201)
    alphabet = [b"a", b"b", b"c", b"*", b"?", b"[", b"]", b"^", b"-", b"\\", b"\xff", b"\x80"]
    patterns = [b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
                for _ in range(400)]
    assert_same_matches(server, redis_server, patterns)


def test_psubscribe_delivery_uses_the_same_glob_as_redis(server, redis_server):
    cases = [(b"h[^e]llo", b"hallo"), (b"h[^e]llo", b"hello"), (b"*", b""), (b"", b""),
             (b"[a-]c]", b"]"), (b"a\\", b"a\\"), (b"[\xff-a]", b"\xff")]

    def receivers(port):
        counts = []
        for pattern, channel in cases:
            with Wire.to(port) as sub:
                sub.send(command("PSUBSCRIBE", pattern))
                sub.read_reply()
                counts.append(redis_client(port).publish(channel, b"m"))
        return counts

    assert receivers(server.port) == receivers(redis_server.port)
