"""The event-loop layer: start the fronts' listeners (the RESP front's,
server/resp/, and through the subsystems the HTTP and gRPC fronts'),
drive the subsystems (subsystem.py: the sweep, rules, replication,
snapshots) through their ticks, and shut down cleanly.  Everything
interesting happens in _protocol and _core; this stays thin.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable

from fastlimit._core import BucketStore, Clock
from fastlimit._protocol import ServerCore
from fastlimit._rules import RuleEngine
from fastlimit.acl.users import Acl
from fastlimit.cluster.reshard import Reshard
from fastlimit.cluster.subsystem import Cluster
from fastlimit.hotkeys.subsystem import HotKeysSubsystem
from fastlimit.overload.subsystem import Overload
from fastlimit.pubsub.subsystem import PubSub
from fastlimit.regions.shares import tier_regions
from fastlimit.regions.subsystem import RegionsSubsystem, reserve_applied
from fastlimit.replication.primary import Replication
from fastlimit.rls.subsystem import RlsSubsystem
from fastlimit.rls.xds_client import RlsXdsSubsystem
from fastlimit.rules.follower import StoreFollower
from fastlimit.rules.registry import RuleRegistry
from fastlimit.rules.store import RuleStore
from fastlimit.rules.subsystem import RulesSubsystem
from fastlimit.server import admission
from fastlimit.server import config as cfg
from fastlimit.server.commands.table import build_table
from fastlimit.server.expiry import Expiry
from fastlimit.server.grpc.listener import GrpcFront
from fastlimit.server.http.history import StatusHistory
from fastlimit.server.http.listener import HttpFront
from fastlimit.server.maxmemory import MaxMemory
from fastlimit.server.persistence import Snapshots
from fastlimit.server.resp.listener import RespFront
from fastlimit.server.subsystem import Subsystem
from fastlimit.server.tls import Tls
from fastlimit.takeover.subsystem import Takeover
from fastlimit.windows.subsystem import WindowsSubsystem

log = logging.getLogger("fastlimit")


class Server:
    def __init__(self, settings: cfg.Settings):
        self.settings = settings
        # First: with --takeover, the running server's offer (its listeners;
        # its buckets follow once the loop runs), or the refusal that stops
        # this start before anything is loaded.
        self.takeover = Takeover(self, log)
        self.clock = Clock(manual=settings.manual_clock)
        self.store = BucketStore(shards=settings.shards, clock=self.clock)
        self.rule_engine = RuleEngine(clock=self.clock, shards=settings.shards)
        # Loads the rules database, then the rules file; raises RuleError
        # (the server refuses to start) if either cannot be used.
        shared = settings.shared_rules_store
        # This tier's region: static rules enforce its share (README, "Regions").
        self.regions = tier_regions(settings.region, settings.regions)
        # A server being taken over holds its rules database until its pause
        # (takeover/): the rules come down the replication link until then.
        self.rules = RuleRegistry(
            self.rule_engine, None if self.takeover.inheriting else self.open_rules_db(),
            settings.rules_file, regions=self.regions)
        self.rules.start(load_file=shared is None)
        # A PostgreSQL rules-store that every node follows (rules/follower.py);
        # rules-db is then its cache.  None: the rules are this node's own.
        self.rules_store = (StoreFollower(self.rules, settings,
                                          f"{settings.bind[0]}:{settings.port}")
                            if shared else None)
        # The Envoy rate limit service's YAML: raises ConfigError (the
        # server refuses to start) if it cannot be used.  Before the
        # snapshot, so the counters it reserves find their buckets there.
        self.rls = RlsSubsystem(self, log)
        self.rls.load_at_start()
        # the `limits` library's windowed counters (windows/): swept with the
        # buckets, and carried as they are (snapshots, replication, maxmemory,
        # slot moves), so made before the snapshot loads
        self.windows = WindowsSubsystem(self.clock)
        # which region batches arrived, kept in the tables (regions/): reserved
        # before the snapshot loads, as the Envoy service's counters are
        self.region_applied = reserve_applied(self.rules)
        self.replication = Replication(self, log)
        self.snapshots = Snapshots(settings.snapshot_file, self, log)
        self.snapshots.load_at_start()
        self.core = ServerCore(self.store, self.rule_engine, build_table(), app=self, log=log)
        self.rls.service.load = self.core.load_meter     # sheds by priority as every front
        # The users (and the aclfile: raises ConfigError, the server refuses
        # to start, if it cannot be used), before any connection.
        self.acl = Acl(self, log)
        self.expiry = Expiry([self.store, self.rule_engine, self.windows.store],
                             self.core.load_meter)
        self.maxmemory = MaxMemory(self)
        self.pubsub = PubSub(self.core)
        self.hotkeys = HotKeysSubsystem(self)
        self.overload = Overload(self, log)
        self.regions_sync = RegionsSubsystem(self, log)
        self.port = settings.port
        # Reads the slot map; raises MapError (the server refuses to start)
        # if it cannot be used.
        self.cluster = Cluster(self, log)
        self.cluster.load(settings)
        self.reshard = Reshard(self, log)
        self.http = HttpFront(self, log)
        # the status page's past: totals a second, a minute (server/http/history.py)
        self.status_history = StatusHistory(self)
        self.grpc = GrpcFront(self, log)
        self.tls = Tls(log)
        # in the order they start; they stop in the reverse order.  tls is
        # last: a CONFIG SET that another refuses never makes new contexts.
        rules_subsystem = RulesSubsystem(self.rules, self.rule_engine, log)
        rules_subsystem.shared_store = self.rules_store
        rules_subsystem.on_sighup.append(self.rls.reload_from_signal)
        rules_subsystem.on_sighup.append(self.tls.reload_from_signal)
        # or from rls-xds-server, once the loop runs (the start never waits for it)
        self.rls_xds = RlsXdsSubsystem(self.rls, settings, log)
        self.subsystems: list[Subsystem] = [
            self.acl, self.expiry, self.maxmemory, rules_subsystem,
            *([self.rules_store] if self.rules_store is not None else []),
            self.replication, self.snapshots, self.pubsub, self.hotkeys, self.overload,
            self.regions_sync, self.windows, self.cluster,
            self.reshard,
            self.http, self.status_history, self.rls, self.rls_xds, self.grpc, self.tls,
            # last: a heir's start ends with its flip, every listener open by then
            self.takeover]
        # maxclients counts every front's connections (server/admission.py)
        self.core.budget += [self.http.shared.connections, self.grpc.shared.connections]
        self._apply_limits(settings)
        self.auth_failures = 0
        self.run_id = os.urandom(20).hex()
        self.started = time.monotonic()
        self.peak_rss = 0
        self.loop_name = "asyncio"
        self.ops_per_sec = 0
        self.resp = RespFront(self, log)      # the RESP listeners (server/resp/)
        self._stopping: asyncio.Event | None = None
        self._started: list[Subsystem] = []
        self._tick_handle: asyncio.TimerHandle | None = None
        self._last_ops = (time.monotonic(), 0)

    # ---- settings -------------------------------------------------------------

    def _apply_limits(self, s: cfg.Settings) -> None:
        core = self.core
        core.requirepass = s.requirepass
        core.max_bulk_len = s.proto_max_bulk_len
        core.max_multibulk_len = s.max_multibulk_len
        core.query_buffer_limit = s.client_query_buffer_limit
        core.output_hard_limit, core.output_soft_limit, core.output_soft_seconds = \
            s.client_output_buffer_limit["normal"]
        core.maxclients = s.maxclients
        for subsystem in self.subsystems:
            subsystem.apply_settings(s)
        logging.getLogger().setLevel(cfg.LOGLEVELS[s.loglevel])

    def config_set(self, pairs) -> None:
        """Applies CONFIG SET pairs (name as sent, value) all or nothing:
        checked on a copy, applied to the core and the subsystems, and only
        then the server's settings; if one refuses a value, the old ones
        are put back."""
        trial = cfg.set_at_runtime(self.settings, pairs)
        if trial.maxclients > self.settings.maxclients:
            fit_maxclients_at_runtime(trial.maxclients)
        rebind = self.resp.rebind(trial, {name.lower() for name, _ in pairs})
        try:
            self._apply_limits(trial)
        except cfg.ConfigError as e:       # Redis's text already (tls)
            rebind.abandon()
            self._apply_limits(self.settings)
            raise cfg.ConfigError(e.reason, e.name or pairs[0][0].lower()) from None
        except (OverflowError, TypeError, ValueError) as e:
            rebind.abandon()
            self._apply_limits(self.settings)
            raise cfg.ConfigError(f"the server cannot use it ({e})", pairs[0][0].lower()) from None
        self.settings = trial
        rebind.commit()

    def open_rules_db(self) -> RuleStore | None:
        """rules-db (a PostgreSQL rules-store's cache when there is one), or
        None when it is ''.  StoreError if it cannot be used."""
        s = self.settings
        return (RuleStore(s.rules_db, cache=s.shared_rules_store is not None)
                if s.rules_db else None)

    def bucket_count(self) -> int:
        return len(self.store) + len(self.rule_engine)

    def key_count(self) -> int:
        """DBSIZE's and INFO keyspace's: the buckets and the windowed counters."""
        return self.bucket_count() + len(self.windows.store)

    @property
    def stores(self) -> tuple:
        """Every store of counts, each with the same interface for what
        carries them (dump/track_changes/drain_changes/set_bound/
        export_slots...): CL.CHECK's buckets, the rules', the windowed
        counters'."""
        return (self.store, self.rule_engine, self.windows.store)

    def flush_buckets(self) -> None:
        self.replication.flushed_all()
        self.store.clear()
        self.rule_engine.clear()
        self.windows.flush()

    def subsystem_info(self, sections: frozenset[str], named: frozenset[str]) -> dict[str, dict]:
        """The subsystems' INFO fields, merged by section."""
        out: dict[str, dict] = {}
        for subsystem in self.subsystems:
            for section, fields in subsystem.info_sections(sections, named).items():
                out.setdefault(section, {}).update(fields)
        return out

    def rules_detail(self, steps) -> list:
        """CL.LIMIT DETAIL rows: [rule id, mode, allowed, remaining,
        retry_after_ms, reset_after_ms] per rule checked."""
        return [[self.rule_id(num), "shadow" if shadow else "enforce", allowed, remaining,
                 retry, reset] for num, shadow, allowed, remaining, retry, reset in steps]

    def rule_id(self, num: int) -> str:
        return self.rules.rule_id(num) if self.rules is not None else str(num)

    def reset_stats(self) -> None:
        core = self.core
        core.total_commands = core.total_connections = core.rejected_connections = 0
        core.total_error_replies = core.net_input_bytes = core.net_output_bytes = 0
        core.error_counts.clear()
        self.auth_failures = 0
        self.acl.reset_stats()
        self.tls.handshake_failures = 0
        self.replication.reset_stats()
        for cmd in core.commands.values():
            cmd.reset_stats()
            for sub in cmd.subcommands.values():
                sub.reset_stats()
        self.http.reset_stats()

    # ---- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """Listens, starts the subsystems, then serves.  A start that fails
        (an address in use, a subsystem that cannot start) stops what it
        started, saving no snapshot, and raises: nothing is left running."""
        loop = asyncio.get_running_loop()
        self.loop_name = type(loop).__module__.split(".")[0]
        self._stopping = asyncio.Event()
        try:
            await self._start(loop)
        except BaseException:
            self.snapshots.save_at_exit = False
            await self.stop(quiet=True)
            raise
        log.info("fastlimit %s ready to accept connections on %s port %d (%s loop, %s clock)",
                 _version(), " ".join(self.settings.bind), self.port, self.loop_name,
                 "manual" if self.clock.manual else "wall")

    async def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        await self.resp.listen(loop)        # bound, not accepting yet
        self._tick_handle = loop.call_later(1 / self.settings.hz, self._tick)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_shutdown)
        for subsystem in self.subsystems:
            self._started.append(subsystem)     # stopped even if its start fails half way
            await subsystem.start()
        # Bound, not accepting, until the subsystems are up: a cluster node
        # that has not heard from Sentinel yet would answer CLUSTERDOWN.
        await self.resp.start_serving()

    def protocol_factory(self, loop, make: Callable[[], asyncio.BaseProtocol], counters,
                         tls) -> Callable[[], asyncio.BaseProtocol]:
        """A listener's protocol factory (a TLS one given tls, its
        LiveContext), counted in maxclients from the accept on."""
        return admission.protocol_factory(
            loop, make, self.core, counters, self.tls.listener_options(tls, self.settings))

    async def listen_front(self, front: str, make: Callable[[], asyncio.BaseProtocol], counters,
                           tls) -> tuple[list[asyncio.AbstractServer], int]:
        """A front's (HTTP, gRPC) listeners on every bind address, serving,
        and the port they are on (a free one, the same on every address,
        when the setting asks for one); none when the front is off.  The
        settings then say the port (CONFIG GET)."""
        name = f"{front.lower()}-port"
        port = cfg.front_port(self.settings, name)
        if port is None:
            return [], 0
        loop = asyncio.get_running_loop()
        servers: list[asyncio.AbstractServer] = []
        for host in self.settings.bind:
            listening = await self.takeover.listen(
                loop, self.protocol_factory(loop, make, counters, tls), front.lower(), host,
                port, tls is not None, serve=True)
            servers += listening
            port = port or listening[0].sockets[0].getsockname()[1]
        setattr(self.settings, cfg.attr_name(name), port)
        log.info("%s on %s port %d", front, " ".join(self.settings.bind), port)
        return servers, port

    def request_shutdown(self, save: bool = True) -> None:
        if self._stopping is not None and not self._stopping.is_set():
            log.warning("shutting down")
            self.snapshots.save_at_exit = save
            self._stopping.set()

    @property
    def stopping(self) -> bool:
        """Whether shutdown has begun (health probes then fail)."""
        return self._stopping is not None and self._stopping.is_set()

    async def serve_until_stopped(self) -> None:
        assert self._stopping is not None, "start() first"
        await self._stopping.wait()
        await self.stop()

    async def stop(self, quiet: bool = False) -> None:
        """Stops listening, closes the clients and stops the subsystems
        started, in reverse order (quiet: after a failed start, which says
        why itself)."""
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        self.resp.close()
        for conn in list(self.core.clients.values()):
            conn.close()
        await self.resp.wait_closed()
        while self._started:
            await self._started.pop().stop()
        if not quiet:
            log.info("fastlimit is now ready to exit, bye bye")

    # ---- periodic work ----------------------------------------------------------

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        self._tick_handle = loop.call_later(1 / self.settings.hz, self._tick)
        for subsystem in self.subsystems:
            subsystem.tick()
        now = time.monotonic()
        then, ops = self._last_ops
        if now - then >= 1.0:
            total = self.core.total_commands
            self.ops_per_sec = int((total - ops) / (now - then))
            self._last_ops = (now, total)
            for conn in list(self.core.clients.values()):
                conn.cron()
            for subsystem in self.subsystems:
                subsystem.cron()


def _version() -> str:
    from fastlimit import __version__
    return __version__


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        log.warning("uvloop is not installed; using asyncio's default loop")
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def fit_maxclients_at_runtime(maxclients: int) -> None:
    """CONFIG SET maxclients: refused, in Redis's words, when the open file
    limit cannot be raised to fit it."""
    fitted = admission.fit_open_files(maxclients, log)
    if fitted < maxclients:
        raise cfg.ConfigError("The operating system is not able to handle the specified "
                              f"number of clients, try with {fitted}", "maxclients")


def run(settings: cfg.Settings) -> None:
    """Serves until shut down.  Raises what stops a start (OSError,
    ConfigError...) once everything it started is stopped."""
    settings.maxclients = admission.fit_open_files(settings.maxclients, log)

    async def main():
        server = Server(settings)
        await server.start()
        await server.serve_until_stopped()

    loop = new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
