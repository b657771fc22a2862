"""Cluster mode: the versioned slot map and the replies built from it
(no asyncio, no server wiring)."""
