"""Rules as a subsystem of the server: SIGHUP reloads the rules file,
denials are summed up in the log once per denial-log-seconds, and INFO
shows the rules, the match cache and its hit rate.  The rules themselves
(documents, store, registry) are fastlimit.rules; the engine that checks
them is fastlimit._rules."""

from __future__ import annotations

import asyncio
import signal
import time

from fastlimit._resp import ReplyError
from fastlimit.rules.files import load_rules_file
from fastlimit.rules.model import RuleError
from fastlimit.server.subsystem import Subsystem, off_loop


class RulesSubsystem(Subsystem):
    def __init__(self, registry, engine, log):
        self.registry = registry
        self.engine = engine
        self.log = log
        self.denial_log_seconds = 10.0
        self.cache_limit = 0
        self._last_denials = (time.monotonic(), 0)
        # Others that reload on SIGHUP too (the rate limit service's YAML).
        self.on_sighup: list = []
        # A PostgreSQL rules-store (follower.py): the rules file then goes
        # to its table.
        self.shared_store = None

    def apply_settings(self, settings) -> None:
        self.engine.set_match_cache_limit(settings.rules_cache_size)
        self.cache_limit = settings.rules_cache_size
        self.denial_log_seconds = settings.denial_log_seconds

    async def start(self) -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.sighup)

    def sighup(self) -> None:
        self.reload_file_in_thread()
        for reload in self.on_sighup:
            reload()

    async def _reload_into_store(self, read) -> None:
        """SIGHUP with a PostgreSQL rules-store: the rules file (read in a
        thread) is written to its table, as CL.RULE RELOAD does; a failure
        is logged."""
        try:
            summary = await self.shared_store.reload_file(read)
        except (RuleError, ReplyError) as e:
            self.log.warning("rules reload failed, nothing changed: %s", e)
            return
        self.log.warning("rules file %s written to the rules store: %s",
                         self.registry.rules_file, summary)

    def reload_file_in_thread(self) -> None:
        """The rules file read and checked in a thread (it takes time with
        its size), its rules put in force on the loop in one commit; a
        read that another reload overtook meanwhile is dropped."""
        path = self.registry.rules_file
        if not path:
            self.registry.reload_from_signal()      # says there is no file
            return
        self.registry.file_reads += 1
        begun = self.registry.file_reads

        def done(wanted, error) -> None:
            if self.registry.file_reads != begun:
                return          # CL.RULE RELOAD or a later SIGHUP read it since

            def read():
                if error is not None:
                    raise error
                return wanted
            if self.shared_store is not None:
                asyncio.ensure_future(self._reload_into_store(read))
            else:
                self.registry.reload_from_signal(read)

        off_loop(lambda: load_rules_file(path), done, "rules-file")

    def cron(self) -> None:
        """One line per denial-log-seconds when rules denied anything: loud
        enough to notice, never a line per request."""
        now = time.monotonic()
        then, seen = self._last_denials
        total = self.engine.denials_total
        if now - then < self.denial_log_seconds or total == seen:
            return
        self._last_denials = (now, total)
        time_ms, num, key, cost = self.engine.recent_denials[-1]
        self.log.warning("%d requests denied (or shadow-denied) by rules in the last %.0f s; "
                         "latest: rule %s, key %r, cost %d", total - seen, now - then,
                         self.registry.rule_id(num), key, cost)

    def info_sections(self, sections, named):
        entries, nbytes, hits, misses = self.engine.match_cache_info
        return {
            # One line per rule only when INFO rules is asked for by name:
            # with 10,000 rules they are a megabyte, too much for every poll.
            "rules": self.registry.info(per_rule="rules" in named),
            "memory": {"rules_cache_entries": entries, "rules_cache_bytes": nbytes,
                       "rules_cache_max_bytes": self.cache_limit},
            "stats": {"rules_cache_hits": hits, "rules_cache_misses": misses},
        }

    async def stop(self) -> None:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        self.registry.close()
