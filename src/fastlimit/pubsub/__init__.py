"""Pub/sub (Redis's pubsub.c): channels and patterns.

- subsystem: subscribers, pattern matching in bounded time, PUBLISH;
- commands: SUBSCRIBE, PSUBSCRIBE, PUBLISH, PUBSUB and the rest."""
