"""TLS for the listeners and the replication link: SSLContexts made from
Redis's tls-* settings, and made again when they change.

A listener gets its context once, when it starts (``Tls.server`` for RESP
and HTTP, ``Tls.grpc`` with ALPN "h2").  That context is a ``LiveContext``:
it hands each new connection to the context in force when the connection
arrives.  So a renewed certificate (CONFIG SET tls-cert-file ..., or
SIGHUP) serves the connections that come after it, and the ones already
open keep theirs.  A new certificate that cannot be used leaves the old
one in force.  Tls counts failed handshakes (INFO stats
``tls_handshake_failures``).  The listeners' connections are driven by
_tls.TlsConnection on OpenSSL's memory BIOs (admission.py puts it around
each front's protocol); the replication link and the other client links
pass their context to the loop.  No event loop here.
"""

from __future__ import annotations

import logging
import os
import ssl

from fastlimit.server.config import TLS_PROTOCOLS, ConfigError
from fastlimit.server.subsystem import Subsystem

# Redis's texts: at start, and as CONFIG SET's answer (the reason goes to
# the log, as Redis logs it).
START_FAILED = "Failed to configure TLS. Check logs for more info."
UPDATE_FAILED = "Unable to update TLS configuration. Check server logs."
NEEDS_CA = ("Either tls-ca-cert-file or tls-ca-cert-dir must be specified when "
            "tls-cluster, tls-replication or tls-auth-clients are enabled!")

CLIENT_VERIFY = {"yes": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "no": ssl.CERT_NONE}
VERBOSE = 15


class TlsError(Exception):
    """A TLS setting the contexts cannot be made with; the text is Redis's
    log line."""


def uses_server_tls(s) -> bool:
    return bool(s.tls_port or s.tls_http or s.tls_grpc)


def uses_client_tls(s) -> bool:
    """Whether this server calls others over TLS: its primary, its
    cluster's peers, its peer regions."""
    return bool(s.tls_replication or s.tls_cluster or s.tls_regions)


def settings_key(s) -> tuple:
    """What the contexts are made from; tls_generation moves on each
    CONFIG SET of a tls-* setting, so setting the same file again re-reads
    it (certificate renewal), as in Redis."""
    return (uses_server_tls(s), uses_client_tls(s), s.tls_cert_file, s.tls_key_file,
            s.tls_key_file_pass, s.tls_client_cert_file, s.tls_client_key_file,
            s.tls_client_key_file_pass, s.tls_ca_cert_file, s.tls_ca_cert_dir,
            s.tls_auth_clients, s.tls_protocols, s.tls_ciphers, s.tls_ciphersuites,
            s.tls_generation)


def _versions(text: str | None) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    """tls-protocols as the lowest and highest version it names (the config
    parser has checked the names); unset is Redis's "TLSv1.2 TLSv1.3"."""
    names = (text or "TLSv1.2 TLSv1.3").lower().split()
    versions = sorted(TLS_PROTOCOLS[name] for name in names)
    return versions[0], versions[-1]


def _common(ctx: ssl.SSLContext, s) -> None:
    """Protocols, ciphers and the CA: the same for both directions."""
    ctx.minimum_version, ctx.maximum_version = _versions(s.tls_protocols)
    if s.tls_ciphers:
        try:
            ctx.set_ciphers(s.tls_ciphers)
        except ssl.SSLError:
            raise TlsError(f"Failed to configure ciphers: {s.tls_ciphers}") from None
    if s.tls_ciphersuites:       # the config parser let it through: this Python has it
        try:
            ctx.set_ciphersuites(s.tls_ciphersuites)  # type: ignore[attr-defined]
        except ssl.SSLError:
            raise TlsError(f"Failed to configure ciphersuites: {s.tls_ciphersuites}") from None
    if s.tls_ca_cert_file or s.tls_ca_cert_dir:
        try:
            ctx.load_verify_locations(cafile=s.tls_ca_cert_file, capath=s.tls_ca_cert_dir)
        except (OSError, ssl.SSLError) as e:
            raise TlsError(f"Failed to configure CA certificate(s) file/directory: "
                           f"{_reason(e)}") from None


def _load_pair(ctx: ssl.SSLContext, cert: str | None, key: str | None,
               password: bytes | None, what: str = "tls") -> None:
    cert, key = _require_pair(cert, key, what)
    try:
        # "" rather than None: OpenSSL would ask for a passphrase on the terminal
        ctx.load_cert_chain(cert, key, password=password or b"")
    except (OSError, ssl.SSLError) as e:
        raise TlsError(f"Failed to load certificate: {cert} or private key: {key}: "
                       f"{_reason(e)}") from None


def _require_pair(cert: str | None, key: str | None, what: str = "tls") -> tuple[str, str]:
    if not cert:
        raise TlsError(f"No {what}-cert-file configured!")
    if not key:
        raise TlsError(f"No {what}-key-file configured!")
    return cert, key


def _reason(e: Exception) -> str:
    if isinstance(e, ssl.SSLError):
        return e.reason or str(e)
    return getattr(e, "strerror", None) or str(e)


def server_context(s, alpn: list[str] | None = None) -> ssl.SSLContext:
    """A listener's context: tls-cert-file/-key-file, tls-auth-clients
    (yes: a certificate the CA signed is required; optional: checked if
    sent; no: not asked for)."""
    _require_pair(s.tls_cert_file, s.tls_key_file)
    if s.tls_auth_clients != "no" and not (s.tls_ca_cert_file or s.tls_ca_cert_dir):
        raise TlsError(NEEDS_CA)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _common(ctx, s)
    _load_pair(ctx, s.tls_cert_file, s.tls_key_file, s.tls_key_file_pass)
    ctx.verify_mode = CLIENT_VERIFY[s.tls_auth_clients]
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


def client_context(s) -> ssl.SSLContext:
    """The context of the replication link and the cluster's calls, as
    Redis makes it: the other end's certificate must chain to the CA (its
    host name is not checked); this end shows tls-client-cert-file, or
    else tls-cert-file, if it has one."""
    if not (s.tls_ca_cert_file or s.tls_ca_cert_dir):
        raise TlsError(NEEDS_CA)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    _common(ctx, s)
    pair = client_pair(s)
    if pair is not None:
        _load_pair(ctx, *pair)
    return ctx


def client_pair(s) -> tuple[str, str | None, bytes | None, str] | None:
    """The certificate this end shows when it calls out: (cert, key,
    passphrase, the settings' prefix), or None."""
    if s.tls_client_cert_file:
        return (s.tls_client_cert_file, s.tls_client_key_file, s.tls_client_key_file_pass,
                "tls-client")
    if s.tls_cert_file:
        return s.tls_cert_file, s.tls_key_file, s.tls_key_file_pass, "tls"
    return None


def redis_py_options(s) -> dict:
    """tls-cluster: redis-py's arguments for calling a peer's tls-port as
    client_context calls (the CA checked, the host name not); {} without
    tls-cluster.  redis-py makes its own context from them."""
    if not s.tls_cluster:
        return {}
    options = {"ssl": True, "ssl_cert_reqs": "required", "ssl_check_hostname": False,
               "ssl_ca_certs": s.tls_ca_cert_file, "ssl_ca_path": s.tls_ca_cert_dir,
               "ssl_min_version": _versions(s.tls_protocols)[0], "ssl_ciphers": s.tls_ciphers}
    pair = client_pair(s)
    if pair is not None:
        options.update(ssl_certfile=pair[0], ssl_keyfile=pair[1], ssl_password=pair[2])
    return options


def grpc_client_files(s) -> tuple[bytes | None, bytes | None, bytes | None]:
    """rls-xds-tls: grpc.ssl_channel_credentials's (root CAs, key, chain),
    read now.  gRPC verifies the server's host name and reads no CA
    directory and no encrypted key."""
    if s.tls_ca_cert_dir and not s.tls_ca_cert_file:
        raise TlsError("rls-xds-tls needs tls-ca-cert-file: gRPC reads no CA directory")
    root = _read(s.tls_ca_cert_file) if s.tls_ca_cert_file else None
    pair = client_pair(s)
    if pair is None:
        return root, None, None
    cert, key, password, what = pair
    cert, key = _require_pair(cert, key, what)
    if password:
        raise TlsError(f"rls-xds-tls cannot use {what}-key-file-pass: gRPC reads no "
                       "encrypted key")
    return root, _read(key), _read(cert)


# The certificate settings whose expiry /metrics shows (an alert's input).
CERTIFICATE_SETTINGS = ("tls-cert-file", "tls-client-cert-file", "tls-ca-cert-file")
_not_after: dict[tuple[str, int, int], float | None] = {}


def certificate_not_after(path: str) -> float | None:
    """When the first certificate of a PEM file stops being valid (its
    notAfter, epoch seconds), or None when the file cannot be read as
    one.  Read again only when the file changes (its mtime or size)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _not_after:
        if len(_not_after) > 64:
            _not_after.clear()
        try:
            # CPython's own PEM decoder (what ssl.get_server_certificate's
            # callers use in tests): no third-party X.509 parser in the server
            decoded = ssl._ssl._test_decode_cert(path)  # type: ignore[attr-defined]
            _not_after[key] = float(ssl.cert_time_to_seconds(decoded["notAfter"]))
        except (ssl.SSLError, OSError, KeyError, ValueError):
            _not_after[key] = None
    return _not_after[key]


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise TlsError(f"Failed to read {path}: {_reason(e)}") from None


class LiveContext:
    """What a listener is given: each connection is made with the context
    in force when it arrives (``current``), not the one in force when the
    listener started; ``owner`` counts the handshakes that fail
    (_tls.TlsConnection drives them on ``current``'s SSL_CTX)."""

    def __init__(self, current: ssl.SSLContext, owner: Tls):
        self.current = current
        self.owner = owner


class Tls(Subsystem):
    """The contexts in force.  apply_settings makes new ones when the tls-*
    settings changed (or were set again): all of them or none, so a
    certificate that cannot be used leaves the old ones serving."""

    def __init__(self, log: logging.Logger):
        self.log = log
        self.server: LiveContext | None = None
        self.grpc: LiveContext | None = None
        self.client: ssl.SSLContext | None = None     # the replication link's, the cluster's
        self.handshake_failures = 0
        self._key: tuple | None = None
        self._settings = None

    def apply_settings(self, s) -> None:
        key = settings_key(s)
        if key == self._key:
            return
        try:
            self._build(s)
        except TlsError as e:
            self.log.warning("%s", e)
            raise ConfigError(START_FAILED if self._key is None else UPDATE_FAILED) from None
        self._key, self._settings = key, s

    def reload_from_signal(self) -> None:
        """SIGHUP: the files read again; if they cannot be used, the
        contexts in force stay (and the log says why)."""
        if self._settings is None or self._key is None:
            return
        try:
            self._build(self._settings)
        except TlsError as e:
            self.log.warning("TLS files not reloaded on SIGHUP, keeping the old ones: %s", e)
            return
        self.log.info("TLS files reloaded on SIGHUP")

    def _build(self, s) -> None:
        server = grpc = client = None
        if uses_server_tls(s):
            server, grpc = server_context(s), server_context(s, ["h2"])
        if uses_client_tls(s):
            client = client_context(s)
        self.client = client
        self.server = self._live(self.server, server)
        self.grpc = self._live(self.grpc, grpc)

    def _live(self, live: LiveContext | None, ctx: ssl.SSLContext | None) -> LiveContext | None:
        """The listener's LiveContext now serving ctx (the same object, as
        a listener holds it)."""
        if ctx is None:
            return live
        if live is None:
            return LiveContext(ctx, self)
        live.current = ctx
        return live

    def listener_options(self, ctx: LiveContext | None, s) -> dict:
        """A listener's TLS options for admission.protocol_factory given ctx
        (none for a plain one).  The handshake must end within
        http-header-timeout (as a request's headers must), read when the
        listener starts."""
        if ctx is None:
            return {}
        return {"ssl": ctx, "ssl_handshake_timeout": s.http_header_timeout}

    def handshake_failed(self, e: ssl.SSLError) -> None:
        self.handshake_failures += 1
        if self.log.isEnabledFor(VERBOSE):
            self.log.log(VERBOSE, "Error accepting a client connection: %s", _reason(e))

    def info_sections(self, sections, named):
        port = self._settings.tls_port if self._settings is not None else 0
        return {"stats": {"tls_port": port, "tls_handshake_failures": self.handshake_failures}}
