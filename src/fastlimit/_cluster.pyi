"""Type stubs for the compiled hash-slot module (fastlimit/_cluster.pyx)."""

SLOTS: int

def keyslot(key: bytes) -> int: ...
