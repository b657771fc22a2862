"""CLIENT LIST and CLIENT INFO's buffer fields as Redis means them: qbuf
the bytes of the query buffer (the command running included), argv-mem
its arguments, multi the commands queued or -1, multi-mem their bytes,
omem the unsent output, tot-mem all of it (issue 16)."""

from __future__ import annotations

import re

from wire import Wire, command, wait_until


def fields(line: bytes) -> dict[str, str]:
    return dict(re.findall(r"(\S+?)=(\S*)", line.decode()))


def mine(port: int) -> dict[str, str]:
    with Wire.to(port) as w:
        reply = w.call("CLIENT", "INFO")
    return fields(reply.split(b"\r\n", 1)[1])


def test_qbuf_and_argv_mem_of_the_running_command(port):
    got = mine(port)
    # *2 $6 client $4 info: 26 bytes in the buffer, 10 of arguments
    assert (got["qbuf"], got["argv-mem"], got["multi"], got["omem"]) == ("26", "10", "-1", "0")
    assert int(got["tot-mem"]) >= 26 + 10
    with Wire.to(port) as w:
        wid = w.call("CLIENT", "ID")[1:-2]
        line = w.call("CLIENT", "LIST", "ID", wid).split(b"\r\n", 1)[1]
    assert fields(line)["qbuf"] == str(len(command("CLIENT", "LIST", "ID", wid)))


def test_multi_and_multi_mem_seen_from_another_client(port):
    with Wire.to(port) as w, Wire.to(port) as other:
        wid = w.call("CLIENT", "ID")[1:-2]
        assert w.call("MULTI") == b"+OK\r\n"
        assert w.call("PING", "abc") == b"+QUEUED\r\n"
        assert w.call("ECHO", "de") == b"+QUEUED\r\n"
        got = fields(other.call("CLIENT", "LIST", "ID", wid).split(b"\r\n", 1)[1])
        assert (got["multi"], got["flags"], got["qbuf"], got["argv-mem"]) == ("2", "x", "0", "0")
        assert int(got["multi-mem"]) > 0
        assert w.call("DISCARD") == b"+OK\r\n"
        got = fields(other.call("CLIENT", "LIST", "ID", wid).split(b"\r\n", 1)[1])
        assert (got["multi"], got["multi-mem"]) == ("-1", "0")


def test_qbuf_of_a_command_still_arriving(server):
    with Wire.to(server.port) as w, Wire.to(server.port) as other:
        wid = w.call("CLIENT", "ID")[1:-2].decode()
        part = b"*2\r\n$4\r\nECHO\r\n$10\r\nabc"
        w.send(part)

        def listed() -> dict:
            return fields(other.call("CLIENT", "LIST", "ID", wid).split(b"\r\n", 1)[1])
        # the server reads the two connections in no set order
        wait_until(lambda: listed()["qbuf"] == str(len(part)), what="the part read")
        got = listed()
        assert got["argv-mem"] == "0"
        assert int(got["tot-mem"]) >= len(part)
