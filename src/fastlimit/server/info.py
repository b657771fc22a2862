"""INFO: Redis's sections and field names, plus a fastlimit section."""

from __future__ import annotations

import os
import platform
import resource
import sys
import time

from fastlimit import __version__
from fastlimit.server.logs import REPEAT_LIMIT

DEFAULT_SECTIONS = ["server", "clients", "memory", "persistence", "stats",
                    "replication", "cpu", "cluster", "keyspace", "fastlimit", "rules", "rls",
                    "shedding", "regions"]
ALL_SECTIONS = DEFAULT_SECTIONS + ["hotkeys", "commandstats", "errorstats"]
# INFO's names for several sections at once.
_GROUPS = {"default": DEFAULT_SECTIONS, "all": ALL_SECTIONS, "everything": ALL_SECTIONS}


def human_bytes(n: int) -> str:
    for unit, size in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n}B"


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _server(core, app) -> dict:
    uptime = int(time.monotonic() - app.started)
    s = app.settings
    return {
        "redis_version": "7.0.0", "fastlimit_version": __version__,
        "redis_mode": "standalone",
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "arch_bits": 64, "multiplexing_api": app.loop_name,
        "python_version": platform.python_version(), "process_id": os.getpid(),
        "run_id": app.run_id, "tcp_port": app.port, "server_time_usec": int(time.time() * 1e6),
        "uptime_in_seconds": uptime, "uptime_in_days": uptime // 86400, "hz": s.hz,
        "clock_mode": "manual" if core.clock.manual else "wall",
        "clock_ms": core.clock.now(), "executable": sys.argv[0],
        "config_file": s.config_file or "",
    }


def _clients(core, app) -> dict:
    return {"connected_clients": len(core.clients), "maxclients": core.maxclients,
            # what maxclients counts: every front's connections and TLS handshakes
            "maxclients_in_use": sum(map(len, core.budget)) + core.handshaking,
            "tls_handshaking_clients": core.handshaking,
            "blocked_clients": 0, "tracking_clients": 0,
            "client_recent_max_input_buffer": max(
                (c.query_buffer_len for c in core.clients.values()), default=0),
            "client_recent_max_output_buffer": max(
                (c.output_buffer_len for c in core.clients.values()), default=0),
            "protocol_error_disconnections": core.protocol_errors,
            # as Redis 7.4: who WATCHes, and the keys watched (each held once)
            "watching_clients": sum(1 for c in core.clients.values() if c.watched_count),
            "total_watched_keys": len(core.watched_keys)}


def _memory(core, app) -> dict:
    tables = sum(store.memory_bytes for store in app.stores)
    rss = rss_bytes()
    app.peak_rss = max(app.peak_rss, rss)
    mm = app.maxmemory
    used = mm.used_memory()
    keys = app.key_count()
    clients = {False: 0, True: 0}     # is a replica -> query buffers, argv and output
    for c in core.clients.values():
        clients[c.replica is not None] += c.input_memory + c.output_buffer_len
    s = app.settings
    return {"used_memory": used, "used_memory_human": human_bytes(used),
            "used_memory_rss": rss, "used_memory_rss_human": human_bytes(rss),
            "used_memory_peak": mm.peak, "used_memory_peak_human": human_bytes(mm.peak),
            "used_memory_dataset": tables, "used_memory_dataset_human": human_bytes(tables),
            "bucket_table_bytes_per_key": round(tables / keys, 1) if keys else 0,
            "mem_fragmentation_ratio": f"{rss / used:.2f}" if used else "0.00",
            "mem_not_counted_for_evict": used - mm.counted(),
            "mem_clients_slaves": clients[True], "mem_clients_normal": clients[False],
            "maxmemory": s.maxmemory, "maxmemory_human": human_bytes(s.maxmemory),
            "maxmemory_policy": s.maxmemory_policy, "mem_allocator": "libc+mmap"}


def _stats(core, app) -> dict:
    return {"total_connections_received": core.total_connections,
            "total_commands_processed": core.total_commands,
            "instantaneous_ops_per_sec": app.ops_per_sec,
            "total_net_input_bytes": core.net_input_bytes,
            "total_net_output_bytes": core.net_output_bytes,
            "rejected_connections": core.rejected_connections,
            "expired_keys": core.store.expired_total + core.rules.expired_total,
            "evicted_keys": app.maxmemory.evicted, "keyspace_hits": 0, "keyspace_misses": 0,
            "total_error_replies": core.total_error_replies,
            "acl_access_denied_auth": app.auth_failures,
            "log_lines_suppressed": REPEAT_LIMIT.suppressed_total}


def _cpu(core, app) -> dict:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"used_cpu_sys": f"{ru.ru_stime:.6f}", "used_cpu_user": f"{ru.ru_utime:.6f}"}


def _keyspace(core, app) -> dict:
    keys = app.key_count()
    return {"db0": f"keys={keys},expires={keys},avg_ttl=0"} if keys else {}


def _fastlimit(core, app) -> dict:
    return {"buckets": app.bucket_count(), "bucket_shards": core.store.shards,
            "bucket_table_bytes": core.store.memory_bytes + core.rules.memory_bytes,
            "buckets_expired": core.store.expired_total + core.rules.expired_total}


def _commandstats(core, app) -> dict:
    out = {}
    for cmd in core.commands.values():
        for c in [cmd, *cmd.subcommands.values()]:
            if c.calls or c.failed_calls or c.rejected_calls:
                per_call = c.usec / c.calls if c.calls else 0
                out[f"cmdstat_{c.name}"] = (
                    f"calls={c.calls},usec={c.usec},usec_per_call={per_call:.2f},"
                    f"rejected_calls={c.rejected_calls},failed_calls={c.failed_calls}")
    return out


def _errorstats(core, app) -> dict:
    return {f"errorstat_{code}": f"count={n}" for code, n in sorted(core.error_counts.items())}


# The sections the server itself fills; the subsystems add theirs (and
# fields to these) through Subsystem.info_sections.
SECTIONS = {"server": _server, "clients": _clients, "memory": _memory, "stats": _stats,
            "cpu": _cpu, "keyspace": _keyspace, "fastlimit": _fastlimit,
            "commandstats": _commandstats, "errorstats": _errorstats}


def info_dict(core, requested: list[str]) -> dict[str, dict]:
    """INFO's sections as {section: {field: value}}, for the named ones:
    as Redis 7.0, the union of every name given, where "default" stands
    for the default sections and "all" and "everything" for all of them
    (none given is "default"); each section once, in INFO's order."""
    wanted: set[str] = set()
    for name in requested or ["default"]:
        wanted.update(_GROUPS.get(name, (name,)))
    names = [n for n in ALL_SECTIONS if n in wanted]
    added = core.app.subsystem_info(frozenset(names), frozenset(requested))
    out = {}
    for name in names:
        fields = SECTIONS[name](core, core.app) if name in SECTIONS else {}
        fields.update(added.get(name, {}))
        out[name] = fields
    return out


def render_info(core, requested: list[str]) -> str:
    parts = []
    for name, fields in info_dict(core, requested).items():
        title = "CPU" if name == "cpu" else name.capitalize()
        lines = [f"# {title}"] + [f"{k}:{v}" for k, v in fields.items()]
        parts.append("\r\n".join(lines) + "\r\n")
    return "\r\n".join(parts)
