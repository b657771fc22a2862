"""ACL LOG's entries (Redis's ACLLogEntry): newest first, a denial like
a recent one counted on it, bounded by acllog-max-len.  The Acl subsystem
(users.py) makes them; ACL LOG (commands.py) shows them."""

from __future__ import annotations

import time

# Entries of ACL LOG with the same reason, context, object and user this
# close together are one entry with a count, as in Redis.
LOG_GROUPING_MS = 60_000
LOG_GROUPING_SCAN = 10


class LogEntry:
    __slots__ = ("count", "reason", "context", "object", "username", "created_ms", "client_info")

    def __init__(self, reason, context, obj, username, client_info):
        self.count = 1
        self.reason, self.context, self.object = reason, context, obj
        self.username, self.client_info = username, client_info
        self.created_ms = time.time() * 1000

    def same_event(self, other: LogEntry) -> bool:
        return (self.reason, self.context, self.object, self.username) == \
            (other.reason, other.context, other.object, other.username) and \
            other.created_ms - self.created_ms <= LOG_GROUPING_MS


def add_entry(entries: list[LogEntry], entry: LogEntry, max_len: int) -> None:
    """entry at the head of entries, or one more of a recent same one
    (moved to the head), and entries bounded by max_len, as Redis's
    addACLLogEntry."""
    for i, current in enumerate(entries[:LOG_GROUPING_SCAN]):
        if current.same_event(entry):
            current.count += 1
            current.created_ms = entry.created_ms
            current.client_info = entry.client_info
            entries.insert(0, entries.pop(i))
            return
    entries.insert(0, entry)
    del entries[max_len:]
