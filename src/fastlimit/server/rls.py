"""The Envoy rate limit service's configuration as a subsystem: rls-config
(envoyproxy/ratelimit's YAML, a file or a directory) is loaded at start (a
bad one stops the start), reloaded when it changes (polled once a second:
the path's and every file's inode, mtime and size, following symlinks, so
a Kubernetes ConfigMap's ``..data`` swap is seen), on SIGHUP and on
CL.RULE RELOAD.  A bad file keeps the configuration in force and says
why, in the log and in INFO rls.  ``server.rls.service`` is the decision
(fastlimit.rls.service) the gRPC front and /json call.  rls-shadow-mode
and rls-merge-domains are the reference's SHADOW_MODE and
MERGE_DOMAIN_CONFIG."""

from __future__ import annotations

import os
import time

from fastlimit.rls.config import ConfigError, config_files, load
from fastlimit.rls.service import LIMIT_STAT_FIELDS, RateLimitService
from fastlimit.server.subsystem import Subsystem


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
                                        shadow_mode=app.settings.rls_shadow_mode)
        self.merge_domains = app.settings.rls_merge_domains
        self.status = "none"
        self.reloaded_at = 0
        self.last_error = ""
        self.reloads = self.failures = 0
        self._stamp = None

    def load_at_start(self) -> None:
        """Raises ConfigError: the server refuses to start without the
        configuration it was given."""
        if self.path:
            self.reload()

    def apply_settings(self, settings) -> None:
        self.service.response_headers = settings.rls_response_headers
        self.service.shadow_mode = settings.rls_shadow_mode
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
        """Loads rls-config all or nothing; ConfigError leaves the
        configuration in force."""
        if not self.path:
            raise ConfigError("no rls-config is configured")
        self._stamp = _stamp(self.path)
        self.reloaded_at = int(time.time())
        try:
            config = load(self.path, self.merge_domains)
            self.service.set_config(config)
        except (ConfigError, ValueError) as e:
            self.status, self.last_error = "failed", str(e)
            self.failures += 1
            raise ConfigError(str(e)) from None
        self.status, self.last_error = "ok", ""
        self.reloads += 1
        self.log.info("rls: %s loaded: %d domains, %d descriptors", self.path,
                      len(config.domains), config.descriptor_count)

    def reload_logged(self, why: str) -> bool:
        try:
            self.reload()
        except ConfigError as e:
            self.log.warning("rls: %s: reload failed, the configuration in force is "
                             "unchanged: %s", why, e)
            return False
        return True

    def reload_from_signal(self) -> None:
        if self.path:
            self.reload_logged("SIGHUP")

    def cron(self) -> None:
        if self.path and _stamp(self.path) != self._stamp:
            self.reload_logged("file changed")

    def info_sections(self, sections, named):
        config = self.service.config
        fields: dict = {
            "rls_config": self.path or "",
            "rls_domains": len(config.domains),
            "rls_descriptors": config.descriptor_count,
            "rls_limits": config.limit_count,
            "rls_last_reload_status": self.status,
            "rls_last_reload_time": self.reloaded_at,
            "rls_reloads": self.reloads,
            "rls_reload_failures": self.failures,
            "rls_last_error": " ".join(self.last_error.split()).replace(",", ";"),
            "rls_unknown_domain_calls": self.service.unknown_domain,
            "rls_global_shadow_mode": self.service.global_shadow_mode,
        }
        for name, s in self.service.stats.items():
            fields[f"rls_domain_{_label(name)}"] = (
                f"calls={s.calls},over_limit={s.over_limit},"
                f"limits_over={s.limits_over},shadow={s.shadow}")
        # as /metrics, the first metrics-rule-labels limits (INFO has no "other")
        cap = max(0, self.app.settings.metrics_rule_labels)
        for (_, key, index), st in sorted(self.service.limit_stats.items())[:cap]:
            name = key if not index else f"{key}#{index}"
            fields[f"rls_limit_{_label(name.encode())}"] = ",".join(
                f"{f}={getattr(st, f)}" for f in LIMIT_STAT_FIELDS)
        return {"rls": fields, "memory": {"rls_config_text_bytes": config.text_bytes}}
