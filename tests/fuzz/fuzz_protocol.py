"""A client's bytes through a whole connection (_protocol.pyx's Connection
and every command handler), on a server in this process with a stand-in
transport, in reads cut anywhere.  A handler's bug is logged as an
"internal error" and answered: that counts as a finding here.  Commands
that would leave the process (SHUTDOWN, REPLICAOF, saves that fork) are
not run: an input naming one is skipped."""

import sys

import harness

with harness.instrumented():
    from fastlimit import _resp
    from fastlimit._protocol import Connection
    from fastlimit.server.app import Server  # noqa: F401  (instrumented with the handlers)

SERVER = harness.server()
# Whole commands, or (command, first argument) pairs.
LEAVES = {b"shutdown", b"save", b"bgsave", b"replicaof", b"slaveof", b"cl.sync",
          b"cl.cluster", b"sync", b"psync", b"monitor"}
LEAVES_SUB = {(b"config", b"set"), (b"config", b"rewrite"), (b"client", b"pause"),
              (b"debug", b"sleep")}


def leaves(commands: list[list[bytes]]) -> bool:
    for argv in commands:
        name = argv[0].lower() if argv else b""
        if name in LEAVES or len(argv) > 1 and (name, argv[1].lower()) in LEAVES_SUB:
            return True
    return False


def one_input(data: bytes) -> None:
    commands, _, _ = _resp.parse(data[1:])
    if leaves(commands):
        return
    harness.feed(Connection(SERVER.core), harness.split(data))
    harness.raise_logged_bugs()
    harness.reset(SERVER)


if __name__ == "__main__":
    harness.main(one_input)
    sys.exit(0)
