"""The Envoy rate limit service's configuration as a subsystem: rls-config
(envoyproxy/ratelimit's YAML, a file or a directory) is loaded at start (a
bad one stops the start), reloaded when it changes (polled once a second:
the path's and every file's inode, mtime and size, following symlinks, so
a Kubernetes ConfigMap's ``..data`` swap is seen), on SIGHUP and on
CL.RULE RELOAD.  A bad file keeps the configuration in force and says
why, in the log and in INFO rls.

Reading and checking take time with the configuration's size (bounded by
rls-max-config-bytes and rls-max-descriptors), so a change seen by the
poll or SIGHUP is read in a thread while the loop serves clients; only
the swap into force (RateLimitService.install) runs on the loop, in one
step (the configuration it replaces is dropped in a thread), so a call
sees the old configuration or the new one.  CL.RULE RELOAD reads in a
thread too and answers once it is decided; the start and CONFIG SET
rls-merge-domains, whose answer says how the reload went, read it on the
loop.  ``server.rls.service`` is the decision
(fastlimit.rls.service) the gRPC front and /json call.  rls-shadow-mode
and rls-merge-domains are the reference's SHADOW_MODE and
MERGE_DOMAIN_CONFIG."""

from __future__ import annotations

import asyncio
import os
import time

from fastlimit.rls.config import ConfigError, config_files, load, load_documents
from fastlimit.rls.service import LIMIT_STAT_FIELDS, Prepared, RateLimitService, retire
from fastlimit.server.subsystem import Subsystem, collector_paused, info_text, off_loop


def _stamp(path: str):
    """What changes when the configuration does (None: unreadable)."""
    try:
        files = config_files(path)
        st = [os.stat(path)] + [os.stat(f) for f in files]
    except OSError:
        return None
    return (os.path.realpath(path), tuple(files),
            tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in st))


def _label(name: bytes) -> str:
    """A name as an INFO field name may show it."""
    return "".join(c if c.isalnum() or c in "-_." else "_"
                   for c in name.decode("utf-8", "replace"))


class RlsSubsystem(Subsystem):
    def __init__(self, app, log):
        self.app = app
        self.log = log
        self.path: str | None = app.settings.rls_config
        # the counters' rule numbers are reserved in the registry: they never
        # collide with rules', and snapshots and replication carry them
        self.service = RateLimitService(app.rule_engine, app.rules,
                                        app.settings.rls_response_headers,
                                        read_only=lambda: app.core.readonly,
                                        shadow_mode=app.settings.rls_shadow_mode,
                                        regions=app.regions)
        self.merge_domains = app.settings.rls_merge_domains
        self.max_config_bytes = app.settings.rls_max_config_bytes
        self.max_descriptors = app.settings.rls_max_descriptors
        self.status = "none"
        self.reloaded_at = 0
        self.last_error = ""
        self.reloads = self.failures = 0
        self._stamp = None
        # Each reload begun takes the next number; one read in a thread is
        # put in force only if no reload began after it (that one decides).
        self._generation = 0
        self._reading: int | None = None     # the reload being read in a thread

    def load_at_start(self) -> None:
        """Raises ConfigError: the server refuses to start without the
        configuration it was given."""
        if self.path:
            self.reload()

    def apply_settings(self, settings) -> None:
        self.service.response_headers = settings.rls_response_headers
        self.service.shadow_mode = settings.rls_shadow_mode
        self.max_config_bytes = settings.rls_max_config_bytes
        self.max_descriptors = settings.rls_max_descriptors
        if settings.rls_merge_domains != self.merge_domains:
            self.set_merge_domains(settings.rls_merge_domains)

    def set_merge_domains(self, merge: bool) -> None:
        """CONFIG SET rls-merge-domains: the files are read again with it,
        and a configuration that cannot be read so refuses the change
        (ValueError) and keeps the one in force."""
        was, self.merge_domains = self.merge_domains, merge
        if not self.path:
            return
        try:
            self.reload()
        except ConfigError as e:
            self.merge_domains = was
            raise ValueError(str(e)) from None

    def reload(self) -> None:
        """Loads rls-config all or nothing, here and now; ConfigError
        leaves the configuration in force."""
        self._begin()
        try:
            with collector_paused():
                prepared, error = self._read(self.merge_domains), None
        except (ConfigError, ValueError) as e:
            prepared, error = None, e
        self._finish(prepared, error)

    def reload_in_thread(self, why: str, answered=None) -> None:
        """Reads rls-config in a thread, then puts it in force on the loop,
        or logs why not (the configuration in force stays); answered(error
        or None) once decided (None too when a reload begun since decides)."""
        generation = self._reading = self._begin()
        merge = self.merge_domains

        def done(prepared, error) -> None:
            if self._reading == generation:
                self._reading = None
            outcome = None
            if generation == self._generation:      # else a reload begun since decides
                try:
                    self._finish(prepared, error)
                except ConfigError as e:
                    self.log.warning("rls: %s: reload failed, the configuration in force is "
                                     "unchanged: %s", why, e)
                    outcome = e
            if answered is not None:
                answered(outcome)

        off_loop(lambda: self._read(merge), done, "rls-config")

    async def reload_off_loop(self, why: str) -> None:
        """reload(), read in a thread while the loop serves clients (a
        command's): ConfigError leaves the configuration in force."""
        decided = asyncio.get_running_loop().create_future()
        self.reload_in_thread(why, decided.set_result)
        error = await decided
        if error is not None:
            raise error

    def put_in_force(self, prepared: Prepared) -> None:
        """service.install, on the loop; the configuration it replaces is
        dropped in a thread, piece by piece (rls.service.retire)."""
        retired = self.service.install(prepared)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return      # the start: no client to wait, it is dropped here
        off_loop(lambda: retire(retired), lambda *_: None, "rls-retire")

    def prepare_documents(self, named_docs, size: int) -> Prepared:
        """An xDS response's configuration, checked as the files are and
        with their bounds, prepared for the service (in the xDS thread)."""
        return self.service.prepare(load_documents(
            named_docs, size, self.merge_domains, self.max_config_bytes, self.max_descriptors))

    def _begin(self) -> int:
        if not self.path:
            raise ConfigError("no rls-config is configured")
        self._stamp = _stamp(self.path)
        self.reloaded_at = int(time.time())
        self._generation += 1
        return self._generation

    def _read(self, merge: bool) -> Prepared:
        """What grows with the configuration: reading, checking, preparing."""
        assert self.path
        return self.service.prepare(load(self.path, merge, self.max_config_bytes,
                                         self.max_descriptors))

    def _finish(self, prepared: Prepared | None, error: Exception | None) -> None:
        """On the loop: prepared put in force in one step, or ConfigError
        saying why not (error, or the engine's refusal)."""
        if prepared is not None:
            try:
                self.put_in_force(prepared)
            except ValueError as e:
                error = e
        if error is not None:
            if not isinstance(error, (ConfigError, ValueError)):
                self.log.error("rls: reading %s failed", self.path, exc_info=error)
            self.status, self.last_error = "failed", str(error) or type(error).__name__
            self.failures += 1
            raise ConfigError(self.last_error)
        assert prepared is not None
        self.status, self.last_error = "ok", ""
        self.reloads += 1
        self.log.info("rls: %s loaded: %d domains, %d descriptors", self.path,
                      len(prepared.config.domains), prepared.config.descriptor_count)

    def reload_from_signal(self) -> None:
        if not self.path:
            return
        if self._reading is not None:
            # the file may have changed after that read began: the poll
            # reads it again once it is done
            self._stamp = None
            return
        self.reload_in_thread("SIGHUP")

    def cron(self) -> None:
        if self.path and self._reading is None and _stamp(self.path) != self._stamp:
            self.reload_in_thread("file changed")

    def info_sections(self, sections, named):
        config = self.service.config
        fields: dict = {
            "rls_config": self.path or "",
            "rls_domains": len(config.domains),
            "rls_descriptors": config.descriptor_count,
            "rls_max_descriptors": self.max_descriptors,
            "rls_limits": config.limit_count,
            "rls_last_reload_status": self.status,
            "rls_last_reload_time": self.reloaded_at,
            "rls_reloads": self.reloads,
            "rls_reload_failures": self.failures,
            "rls_reload_in_progress": int(self._reading is not None),
            "rls_last_error": info_text(self.last_error, 1024),
            "rls_unknown_domain_calls": self.service.unknown_domain,
            "rls_global_shadow_mode": self.service.global_shadow_mode,
        }
        for name, s in self.service.stats.items():
            fields[f"rls_domain_{_label(name)}"] = (
                f"calls={s.calls},over_limit={s.over_limit},"
                f"limits_over={s.limits_over},shadow={s.shadow}")
        # as /metrics, the first metrics-rule-labels limits (INFO has no "other")
        cap = max(0, self.app.settings.metrics_rule_labels)
        for (_, key, index), st in self.service.limit_stats(cap):
            name = key if not index else f"{key}#{index}"
            fields[f"rls_limit_{_label(name.encode())}"] = ",".join(
                f"{f}={getattr(st, f)}" for f in LIMIT_STAT_FIELDS)
        return {"rls": fields, "memory": {"rls_config_text_bytes": config.text_bytes,
                                          "rls_max_config_bytes": self.max_config_bytes}}
