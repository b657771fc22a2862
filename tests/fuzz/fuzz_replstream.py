"""The replication stream as a standby reads it from its primary
(replication/replica.py's PrimaryLink on replication/stream.py's framing: the
handshake reply, then rules, full copy, batch and flush frames applied to
the standby's tables), in reads cut anywhere.  A malformed stream must
cost a resync with a clear error; a bug is logged with its traceback
("failed; resyncing"), which counts as a finding here.  The handshake's
+FULLSYNC line is put before the bytes unless the first byte is odd."""

import sys

import harness

with harness.instrumented():
    from fastlimit.replication.replica import PrimaryLink

SERVER = harness.server()
FULLSYNC = b"+FULLSYNC 8d3f0c2a6b1e4f5a9c7d2e1b0a3f4c5d6e7f8a9b 0\r\n"


def one_input(data: bytes) -> None:
    link = PrimaryLink(SERVER.replication, "127.0.0.1", 1)
    transport = harness.Transport()
    link.connection_made(transport)
    reads = harness.split(data)
    if not data or data[0] & 1 == 0:
        reads.insert(0, FULLSYNC)
    for read in reads:
        if transport.closed:
            break
        link.data_received(read)
    link.stop()
    harness.raise_logged_bugs()
    SERVER.rules.mirror([])
    SERVER.flush_buckets()


if __name__ == "__main__":
    harness.main(one_input)
    sys.exit(0)
