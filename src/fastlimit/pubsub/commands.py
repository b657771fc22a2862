"""Pub/Sub: SUBSCRIBE, UNSUBSCRIBE, PSUBSCRIBE, PUNSUBSCRIBE, PUBLISH and
PUBSUB, on the registry in pubsub/subsystem.py.  The (un)subscribe commands
answer with one frame per channel, pushed by the registry, and no reply
of their own."""

from __future__ import annotations

from fastlimit._resp import NO_REPLY, ReplyError


def cmd_subscribe(conn, args):
    conn.core.app.pubsub.subscribe(conn, args[1:], pattern=False)
    return NO_REPLY


def cmd_unsubscribe(conn, args):
    conn.core.app.pubsub.unsubscribe(conn, args[1:], pattern=False)
    return NO_REPLY


def cmd_psubscribe(conn, args):
    conn.core.app.pubsub.subscribe(conn, args[1:], pattern=True)
    return NO_REPLY


def cmd_punsubscribe(conn, args):
    conn.core.app.pubsub.unsubscribe(conn, args[1:], pattern=True)
    return NO_REPLY


def cmd_publish(conn, args):
    return conn.core.app.pubsub.publish(args[1], args[2])


def cmd_pubsub_channels(conn, args):
    if len(args) > 3:
        raise ReplyError("ERR unknown subcommand or wrong number of arguments for "
                         f"'{args[1].decode(errors='replace')[:128]}'. Try PUBSUB HELP.")
    return conn.core.app.pubsub.channel_names(args[2] if len(args) == 3 else None)


def cmd_pubsub_numsub(conn, args):
    pubsub = conn.core.app.pubsub
    return [item for channel in args[2:] for item in (channel, pubsub.numsub(channel))]


def cmd_pubsub_numpat(conn, args):
    return len(conn.core.app.pubsub.patterns)
