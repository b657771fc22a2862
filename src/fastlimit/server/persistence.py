"""The Snapshots subsystem: when the server's snapshot is written (SAVE in
the foreground; BGSAVE, every save-seconds and at shutdown by a forked
child) and the one loaded at start.  The file format, and writing and
reading it, are snapshot.py's (no event loop)."""

from __future__ import annotations

import os
import signal
import time

from fastlimit.server.snapshot import (
    SnapshotError,
    fork_worker,
    read,
    remove_stale_temp_files,
    restore,
    rule_numbers,
    temp_path,
    unlink_if_there,
    write,
)
from fastlimit.server.subsystem import Subsystem


class Snapshots(Subsystem):
    """The server's snapshot file: loaded at start, written by SAVE (in the
    foreground), BGSAVE (by a forked child, so the server keeps answering:
    the fork is the only pause, a copy-on-write page table), every
    save-seconds and at shutdown (unless SHUTDOWN NOSAVE)."""

    # After a failed save, the next periodic attempt waits this long
    # (Redis's CONFIG_BGSAVE_RETRY_DELAY): no fork on every tick.
    RETRY_AFTER_FAILURE_S = 5.0

    def __init__(self, path: str | None, app, log):
        self.path = path
        self.app = app
        self.log = log
        self.child: int | None = None
        self.last_save_time = int(time.time())
        self.last_attempt = time.time()
        self.last_status = "ok"
        self.saves = 0
        self.save_seconds = 0
        self.save_at_exit = True

    def apply_settings(self, settings) -> None:
        self.save_seconds = settings.save_seconds

    def tick(self) -> None:
        self.poll()
        if self.due(self.save_seconds):
            self.background_save()

    async def stop(self) -> None:
        self.stop_background_save()
        if not (self.save_at_exit and self.path):
            return
        try:
            self.save()
            self.log.info("saved the snapshot %s before exiting", self.path)
        except (OSError, SnapshotError) as e:
            self.log.error("could not save the snapshot before exiting: %s", e)

    def info_sections(self, sections, named):
        return {"persistence": {
            "loading": 0, "rdb_bgsave_in_progress": int(self.child is not None),
            "rdb_last_save_time": self.last_save_time,
            "rdb_last_bgsave_status": self.last_status, "rdb_saves": self.saves,
            "snapshot_file": self.path or "", "aof_enabled": 0}}

    def load_at_start(self) -> None:
        """Restores the snapshot if there is one.  A damaged file is moved
        aside and the server starts empty: no trust in bad data."""
        if not self.path:
            return
        for name in remove_stale_temp_files(self.path):
            self.log.warning("removed %s, left by a save that did not finish", name)
        if not os.path.exists(self.path):
            return
        app = self.app
        try:
            loaded = restore(read(self.path), app.store, app.rule_engine, app.rules,
                             app.windows.store)
        except Exception as e:   # whatever is wrong with it, the server must start
            if not isinstance(e, (SnapshotError, OSError)):
                self.log.exception("restoring snapshot %s failed unexpectedly", self.path)
            app.flush_buckets()
            aside = f"{self.path}.corrupt-{int(time.time() * 1000)}"
            os.replace(self.path, aside)
            self.log.error("snapshot %s is unusable (%s); moved to %s, starting without it",
                           self.path, e, aside)
            return
        windowed = len(app.windows.store)      # it was empty: everything loads first
        self.log.info("loaded %d buckets from snapshot %s (and %d windowed counters)",
                      loaded - windowed, self.path, windowed)

    def save(self) -> None:
        """Writes the snapshot now, blocking (SAVE, shutdown)."""
        if not self.path:
            raise SnapshotError("no snapshot file is configured (snapshot-file)")
        app = self.app
        self.last_attempt = time.time()
        try:
            write(self.path, app.store, app.rule_engine, rule_numbers(app.rules),
                  app.clock.now(), app.windows.store)
        except BaseException:
            self._saved("err")
            raise
        self._saved("ok")

    def background_save(self) -> bool:
        """Starts BGSAVE; False when one is already running."""
        if not self.path:
            raise SnapshotError("no snapshot file is configured (snapshot-file)")
        if self.child is not None:
            return False
        app = self.app
        numbers, now = rule_numbers(app.rules), app.clock.now()
        self.last_attempt = time.time()
        pid = fork_worker(lambda: write(self.path, app.store, app.rule_engine, numbers, now,
                                        app.windows.store))
        self.child = pid
        self.log.info("background saving started by pid %d", pid)
        return True

    def poll(self) -> None:
        """Reaps a finished BGSAVE child (called from the server's tick)."""
        if self.child is None:
            return
        pid, status = os.waitpid(self.child, os.WNOHANG)
        if pid == 0:
            return
        ok = os.waitstatus_to_exitcode(status) == 0
        if not ok:
            self._remove_temp_file(self.child)
        self.child = None
        self._saved("ok" if ok else "err")
        (self.log.info if ok else self.log.error)(
            "background saving %s", "terminated with success" if ok else "failed")

    def due(self, every_s: int) -> bool:
        now = time.time()
        return (bool(self.path) and every_s > 0 and self.child is None
                and now - self.last_save_time >= every_s
                and (self.last_status == "ok" or
                     now - self.last_attempt >= self.RETRY_AFTER_FAILURE_S))

    def stop_background_save(self) -> None:
        """Ends a running BGSAVE (at shutdown, before the final save, which
        an older child finishing later must not replace)."""
        if self.child is None:
            return
        try:
            os.kill(self.child, signal.SIGKILL)
            os.waitpid(self.child, 0)
        except ChildProcessError:
            pass
        self._remove_temp_file(self.child)
        self.child = None

    def _remove_temp_file(self, pid: int) -> None:
        """What a BGSAVE child that did not finish left behind."""
        assert self.path is not None     # only a save to a file starts a child
        unlink_if_there(temp_path(self.path, pid))

    def _saved(self, status: str) -> None:
        self.last_status = status
        if status == "ok":
            self.last_save_time = int(time.time())
            self.saves += 1
