"""The snapshot loader (server/snapshot.py's decode and restore, and the C
loaders of _core.pyx and _rules.pyx they call): a snapshot file's bytes
restored into an empty server that has some of the rules the file names
(and its windowed counters' store: _windows.pyx's loaders).
Most inputs get a valid checksum and end marker put on them (the first
byte even), so the fuzzer reaches past the checksum into the metadata and
the records; the others are decoded as they are.  SnapshotError is the
one clear error."""

import struct
import sys
import zlib

import harness

with harness.instrumented():
    from fastlimit.server import snapshot

SERVER = harness.server()
for rule_id, doc in [("orders", '{"capacity": 20, "refill_per_second": 10}'),
                     ("hourly", '{"algorithm": "token_bucket", "capacity": 1000, '
                                '"refill": 1000, "period_ms": 3600000}'),
                     ("window", '{"algorithm": "sliding_window", "limit": 100, '
                                '"window_ms": 60000}'),
                     ("conns", '{"algorithm": "concurrency", "limit": 5, "lease_ms": 30000}')]:
    SERVER.rules.set(rule_id, doc)


def sealed(body: bytes) -> bytes:
    """body (magic and all) with the checksum and end marker a writer puts."""
    return body + struct.pack("<I", zlib.crc32(body)) + snapshot.FOOTER


def one_input(data: bytes) -> None:
    raw = data[1:]
    if not data or data[0] & 1 == 0:
        raw = sealed(snapshot.MAGIC + raw)
    with harness.expect(snapshot.SnapshotError):
        snapshot.restore(snapshot.decode(raw), SERVER.store, SERVER.rule_engine, SERVER.rules,
                         SERVER.windows.store)
    SERVER.flush_buckets()


if __name__ == "__main__":
    harness.main(one_input)
    sys.exit(0)
