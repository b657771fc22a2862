"""What a client connection looks like to CLIENT LIST, CLIENT INFO and
ACL LOG's client-info: one line of Redis's fields, in its order."""

from __future__ import annotations


def _text(value) -> str:
    return value.decode("utf-8", "replace") if value else ""


def _flags(c) -> str:
    """Redis's flag letters, in its order; N for none."""
    flags = ("O" * c.monitoring + "S" * (c.replica is not None) + "P" * c.subscribed
             + "x" * c.in_multi)
    return flags or "N"


def _user_name(c) -> str:
    return c.user.name if c.user is not None else "default"


def client_line(c, now: float) -> str:
    """One CLIENT LIST line, Redis's fields in its order.  tot-mem is what
    the client holds: its input buffer and parser, running arguments,
    queued commands, unsent output and subscriptions."""
    qbuf, argv_mem, multi_mem = c.query_buffer_len, c.argv_memory, c.multi_memory
    omem = c.output_buffer_len
    total = c.input_memory + argv_mem + multi_mem + omem + c.pubsub_bytes
    return (f"id={c.id} addr={c.addr} laddr={c.laddr} fd=-1 name={_text(c.name)} "
            f"age={int(now - c.created)} idle={int(now - c.last_interaction)} "
            f"flags={_flags(c)} db=0 sub={len(c.pubsub_channels or ())} "
            f"psub={len(c.pubsub_patterns or ())} ssub=0 "
            f"multi={len(c.multi_queue) if c.in_multi else -1} "
            f"qbuf={qbuf} qbuf-free={c.query_buffer_free} argv-mem={argv_mem} "
            f"multi-mem={multi_mem} rbs=0 rbp=0 "
            f"obl=0 oll=0 omem={omem} tot-mem={total} events=r "
            f"cmd={c.last_command} user={_user_name(c)} redir=-1 resp={c.proto} "
            f"lib-name={_text(c.lib_name)} lib-ver={_text(c.lib_ver)}")
