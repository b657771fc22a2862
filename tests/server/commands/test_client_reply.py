"""CLIENT REPLY ON|OFF|SKIP on fastlimit and a real redis-server: the
same bytes for the same commands (issue 16)."""

from __future__ import annotations

from wire import Wire, command


def replies_of(port: int, *commands: tuple, expect: int) -> bytes:
    """Sends the commands in one write; returns the first `expect` replies
    and checks nothing more arrives."""
    with Wire.to(port) as w:
        w.send(b"".join(command(*c) for c in commands))
        got = b"".join(w.read_reply() for _ in range(expect))
        assert w.is_open(), "closed"
        assert w.buf == b"", w.buf
        return got


def test_reply_off_silences_until_on(port):
    got = replies_of(port, ("CLIENT", "REPLY", "OFF"), ("PING", "a"), ("ECHO", "b"),
                     ("NOSUCH",), ("CLIENT", "REPLY", "ON"), ("PING", "c"), expect=2)
    assert got == b"+OK\r\n$1\r\nc\r\n"


def test_reply_skip_silences_the_next_command_only(port):
    got = replies_of(port, ("CLIENT", "REPLY", "SKIP"), ("PING", "a"), ("PING", "b"),
                     expect=1)
    assert got == b"$1\r\nb\r\n"


def test_reply_on_after_skip_answers(port):
    got = replies_of(port, ("CLIENT", "REPLY", "SKIP"), ("CLIENT", "REPLY", "ON"), ("PING",),
                     expect=2)
    assert got == b"+OK\r\n+PONG\r\n"


def test_reply_skip_under_off_changes_nothing(port):
    got = replies_of(port, ("CLIENT", "REPLY", "OFF"), ("CLIENT", "REPLY", "SKIP"),
                     ("PING", "a"), ("CLIENT", "REPLY", "ON"), ("PING", "b"), expect=2)
    assert got == b"+OK\r\n$1\r\nb\r\n"


def test_reply_bad_argument(port):
    with Wire.to(port) as w:
        assert w.call("CLIENT", "REPLY", "maybe") == b"-ERR syntax error\r\n"
        assert w.call("CLIENT", "REPLY") \
            == b"-ERR wrong number of arguments for 'client|reply' command\r\n"


def test_reply_off_keeps_pubsub_pushes(port):
    # Redis's "PubSub messages with CLIENT REPLY OFF": pushes are not replies.
    with Wire.to(port) as sub, Wire.to(port) as pub:
        assert sub.call("HELLO", "3").startswith(b"%")
        sub.send(command("CLIENT", "REPLY", "OFF") + command("SUBSCRIBE", "ch"))
        assert sub.read_reply() == b">3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n"
        assert pub.call("PUBLISH", "ch", "hi") == b":1\r\n"
        assert sub.read_reply() == b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n"
        sub.send(command("PING"))
        assert sub.is_open() and sub.buf == b""


def test_reply_off_silences_a_sliced_reply(server):
    # CONFIG GET answers in slices, after the read it came in
    with Wire.to(server.port) as w:
        w.send(command("CLIENT", "REPLY", "OFF") + command("CONFIG", "GET", "*")
               + command("CLIENT", "REPLY", "ON") + command("PING"))
        assert w.read_reply() == b"+OK\r\n"
        assert w.read_reply() == b"+PONG\r\n"
