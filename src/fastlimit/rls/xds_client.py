"""The rate limit service's configuration from an xDS server, as
envoyproxy/ratelimit takes it with CONFIG_TYPE=GRPC_XDS_SOTW and Envoy
Gateway serves it: one ADS stream (State of the World) asking for every
``RateLimitConfig`` for node rls-xds-node-id.

Each response is the whole configuration: its resources are decoded
(fastlimit.rls.xds_codec), checked as the YAML is (config.load_documents, one
domain per resource, with rls-max-config-bytes and rls-max-descriptors),
prepared for the service, all of it in the stream's thread, and put in
force on the loop in one step, all or nothing; then ACKed (its
version_info and nonce echoed).  A response that cannot be used is NACKed
(the last ACKed version, its nonce, and error_detail saying why) and the
configuration in force stays.  A broken stream is opened again after a
wait that doubles from the first of rls-xds-backoff up to the longest,
with jitter, and starts again from the first once a stream has carried a
response; the new stream asks from the last ACKed version.  Until the
first configuration arrives the service runs with none (every domain
unknown: OK), as the reference does with FORCE_START_WITHOUT_INITIAL_CONFIG.

The stream is grpcio's (the xDS stream is not the hot path), blocking, in
a daemon thread: the event loop never waits on the xDS server.  The
thread hands a prepared configuration to the loop (call_soon_threadsafe)
and waits for the service's verdict before it answers.  grpcio is imported
only when rls-xds-server is set.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import random
import threading
import time

from fastlimit import __version__
from fastlimit.rls import xds_codec as xds
from fastlimit.rls.config import ConfigError
from fastlimit.rls.service import Prepared
from fastlimit.server import config as cfg
from fastlimit.server import tls
from fastlimit.server.subsystem import Subsystem, collector_paused, info_text

# google.rpc.Code of a NACK's error_detail: the configuration is invalid.
INVALID_ARGUMENT = 3
# gRPC's default, said here: a larger response is refused (and the stream
# opened again), so a configuration's size is bounded.
MAX_MESSAGE = 4 * 1024 * 1024
MAX_NACK_MESSAGE = 4096
# A stream idle this long is probed; go-control-plane's servers accept a
# ping every 5 minutes (gRPC's default enforcement).
KEEPALIVE_MS, KEEPALIVE_TIMEOUT_MS = 300_000, 20_000
# How long shutdown waits for the thread (cancelling the call ends its
# wait at once; a thread still busy after this is a daemon and dies with us).
STOP_WAIT_S = 2.0
# grpc's connectivity poller wakes every 0.2 s; a channel is closed once it
# has ended, or after this anyway (close_channel).
POLLER_END_S = 1.0

TWO_SOURCES = ("rls-config and rls-xds-server are two sources of the rate limit service's "
               "configuration: give one")


def close_channel(channel) -> None:
    """Close a channel once grpc's connectivity poller has ended.

    subscribe() starts a poller thread, which ends at its next wake after
    the last unsubscribe().  A close before that makes the poller's next
    watch raise ValueError in grpc's own thread, printed as a traceback
    (grpc/grpc#18995): a stop or a failed stream right after the subscribe
    did so.  grpc has no public way to wait for the poller, so this reads
    its flag, and closes anyway after POLLER_END_S."""
    state = getattr(channel, "_connectivity_state", None)
    deadline = time.monotonic() + POLLER_END_S
    while getattr(state, "polling", False) and time.monotonic() < deadline:
        time.sleep(0.005)
    channel.close()


class _Stopped(Exception):
    """The client was stopped while it waited."""


class XdsStats:
    """What INFO rls shows of one client; written by its thread."""

    def __init__(self, server: str):
        self.server = server
        self.state = "connecting"       # connecting, connected, waiting (to reconnect), stopped
        self.version = ""               # the last version ACKed (the one in force)
        self.acks = self.nacks = self.streams = 0
        self.last_error = ""
        self.last_update = 0            # unix time of the last ACK


class XdsClient:
    """One ADS stream at a time to server, in its own thread, until stop()."""

    def __init__(self, server: str, node_id: str, backoff: tuple[float, float], loop,
                 prepare, put_in_force, log, tls_files=None):
        self.server = server
        self.tls_files = tls_files            # rls-xds-tls: (root CAs, key, chain), or None
        self.node = xds.encode_node(node_id, "fastlimit", __version__)
        self.first_wait, self.longest_wait = backoff
        self.loop = loop
        # in this thread: (named documents, size) -> Prepared, or raises
        # ConfigError (the settings of the moment: rls-merge-domains, bounds)
        self.prepare = prepare
        self.put_in_force = put_in_force      # on the loop: Prepared -> None, or raises
        self.log = log
        self.stats = XdsStats(server)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._call = None
        self._thread = threading.Thread(target=self._run, name="rls-xds", daemon=True)

    def start(self) -> None:
        # read when grpc is imported: its fork handlers are for a child that
        # uses gRPC; BGSAVE's does not, and with this stream open they only
        # log that they skip
        os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
        self._thread.start()

    def stop(self) -> None:
        """Ends the stream and the waits at once; the thread then exits.
        Called on the loop, so no configuration is put in force after it."""
        self._stopping.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()

    async def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    # ---- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        # here: a server without xDS never pays for the import
        import grpc  # type: ignore[import-untyped]  # no stubs in the test set-up

        wait = self.first_wait
        while not self._stopping.is_set():
            try:
                carried = self._stream(grpc)
            except Exception:       # a bug: say so, and keep the client alive
                self.log.exception("rls: xDS server %s: the client failed", self.server)
                carried = False
            if self._stopping.is_set():
                break
            wait = self.first_wait if carried else min(wait * 2, self.longest_wait)
            self.stats.state = "waiting"
            self._stopping.wait(random.uniform(self.first_wait, wait))
        self.stats.state = "stopped"

    def _stream(self, grpc) -> bool:
        """One stream, until it breaks; whether it carried a response."""
        self.stats.state = "connecting"
        self.stats.streams += 1
        requests: queue.SimpleQueue = queue.SimpleQueue()
        requests.put(xds.encode_discovery_request(self.node, self.stats.version, ""))
        options = [("grpc.max_receive_message_length", MAX_MESSAGE),
                   ("grpc.keepalive_time_ms", KEEPALIVE_MS),
                   ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                   ("grpc.enable_retries", 0)]
        if self.tls_files is None:
            channel = grpc.insecure_channel(self.server, options=options)
        else:
            channel = grpc.secure_channel(
                self.server, grpc.ssl_channel_credentials(*self.tls_files), options=options)
        carried = False

        def connectivity(c) -> None:
            if c == grpc.ChannelConnectivity.READY and not self._stopping.is_set():
                self.stats.state = "connected"

        channel.subscribe(connectivity, try_to_connect=True)
        try:
            # bytes both ways: no (de)serializers
            call = channel.stream_stream(xds.ADS_METHOD)(iter(requests.get, None))
            with self._lock:
                self._call = call
            if self._stopping.is_set():
                call.cancel()
            for message in call:
                carried = True
                requests.put(self._answer(message))
            error = "the xDS server ended the stream"
        except grpc.RpcError as e:
            error = f"{e.code().name}: {e.details()}"
        except xds.XdsError as e:
            error = f"a DiscoveryResponse that cannot be read: {e}"
        except _Stopped:
            error = ""
        finally:
            requests.put(None)
            with self._lock:
                self._call = None
            channel.unsubscribe(connectivity)
            close_channel(channel)
        if not self._stopping.is_set():
            self.stats.last_error = error
            self.log.warning("rls: xDS server %s: %s; reconnecting", self.server, error)
        return carried

    def _answer(self, message: bytes) -> bytes:
        """The ACK or NACK of one response, once it is in force or refused."""
        # undecodable: XdsError ends the stream, as grpc-go's codec error
        # does the reference's (a NACK without the nonce would ask again)
        response = xds.decode_discovery_response(message)
        nonce = response.nonce
        try:
            with collector_paused():
                prepared = self.prepare(xds.rate_limit_documents(response), len(message))
            self._put_in_force(prepared)
        except (xds.XdsError, ConfigError, ValueError) as e:
            problem = str(e)[:MAX_NACK_MESSAGE]
            self.stats.nacks += 1
            self.stats.last_error = problem
            self.log.warning("rls: xDS server %s: NACK, the configuration in force (version "
                             "'%s') is unchanged: %s", self.server, info_text(self.stats.version),
                             " ".join(problem.split()))
            return xds.encode_discovery_request(self.node, self.stats.version, nonce,
                                                (INVALID_ARGUMENT, problem))
        self.stats.version = response.version_info
        self.stats.acks += 1
        self.stats.last_error = ""
        self.stats.last_update = int(time.time())
        self.log.info("rls: xDS server %s: version '%s' in force: %d domains, %d descriptors",
                      self.server, info_text(response.version_info),
                      len(prepared.config.domains), prepared.config.descriptor_count)
        return xds.encode_discovery_request(self.node, response.version_info, nonce)

    def _put_in_force(self, prepared: Prepared) -> None:
        """Runs put_in_force on the loop and waits for it (its exception
        raised here), or raises _Stopped."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        try:
            self.loop.call_soon_threadsafe(self._on_loop, prepared, done)
        except RuntimeError:        # the loop is closed: the server is exiting
            raise _Stopped() from None
        while True:
            try:
                return done.result(timeout=0.1)
            except concurrent.futures.TimeoutError:
                if self._stopping.is_set():
                    raise _Stopped() from None

    def _on_loop(self, prepared: Prepared, done: concurrent.futures.Future) -> None:
        if self._stopping.is_set():
            done.set_exception(_Stopped())
            return
        try:
            self.put_in_force(prepared)
        except Exception as e:      # ValueError: refused; anything else reaches _run
            done.set_exception(e)
        else:
            done.set_result(None)


class RlsXdsSubsystem(Subsystem):
    """rls-xds-server's client: started with the loop, restarted when
    CONFIG SET changes its settings, stopped at shutdown."""

    def __init__(self, rls, settings, log) -> None:
        """Raises ConfigError (the server refuses to start) when rls-config
        is set too: the reference takes one CONFIG_TYPE, and two sources
        would replace each other's configuration."""
        if settings.rls_config and settings.rls_xds_server:
            raise ConfigError(TWO_SOURCES)
        self.rls = rls              # rls/subsystem.py's RlsSubsystem: its service takes the config
        self.log = log
        self.client: XdsClient | None = None
        self._wanted: tuple | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def apply_settings(self, settings) -> None:
        if settings.rls_config and settings.rls_xds_server:
            raise ValueError(TWO_SOURCES)
        wanted = (settings.rls_xds_server, settings.rls_xds_node_id, settings.rls_xds_backoff,
                  self._tls_files(settings))
        if wanted != self._wanted:
            self._wanted = wanted
            if self._loop is not None:
                self._restart()

    @staticmethod
    def _tls_files(settings) -> tuple | None:
        """The files rls-xds-tls needs, read now (so a renewed certificate
        restarts the stream); the server's ConfigError if they cannot be
        used (CONFIG SET refuses, the start fails)."""
        if not (settings.rls_xds_tls and settings.rls_xds_server):
            return None
        try:
            return tls.grpc_client_files(settings)
        except tls.TlsError as e:
            raise cfg.ConfigError(str(e), "rls-xds-tls") from None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._restart()

    def _restart(self) -> None:
        """A new client for the settings in force; the old one is stopped
        (its thread exits by itself) and the configuration it put in force
        stays until the new one brings another."""
        if self.client is not None:
            self.client.stop()
        assert self._wanted is not None
        server, node_id, backoff, tls_files = self._wanted
        self.client = None
        if server:
            self.client = XdsClient(server, node_id, backoff, self._loop,
                                    self.rls.prepare_documents, self.rls.put_in_force,
                                    self.log, tls_files)
            self.client.start()

    async def stop(self) -> None:
        if self.client is not None:
            self.client.stop()
            await self.client.join(STOP_WAIT_S)

    def info_sections(self, sections, named):
        if "rls" not in sections:
            return {}
        s = self.client.stats if self.client is not None else None
        return {"rls": {
            "rls_xds_server": s.server if s else "",
            "rls_xds_state": s.state if s else "off",
            "rls_xds_version": info_text(s.version) if s else "",
            "rls_xds_acks": s.acks if s else 0,
            "rls_xds_nacks": s.nacks if s else 0,
            "rls_xds_streams": s.streams if s else 0,
            "rls_xds_last_update": s.last_update if s else 0,
            "rls_xds_last_error": info_text(s.last_error) if s else "",
        }}
