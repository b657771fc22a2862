"""Moving hash slots between shards without resetting anyone: copy, pause,
flip (notes/cluster.md §5.3); clients only ever see MOVED, never ASK.

``CL.CLUSTER MOVE <start-end> <shard>``, sent to the primary serving the
slots, moves them to the primary of another shard of the map and answers
once they are moved (``CL.CLUSTER MOVESTATUS`` shows the move meanwhile
and after):

1. Copy.  Every write is noted (the replication change log; this node
   starts it when no replica has), then the tables are walked in steps of
   a few milliseconds, and the buckets of the moving slots go to the
   target (``CL.CLUSTER IMPORT <blob>``: a snapshot-format blob, the
   records as snapshots and replication carry them; the target's
   standbys get them through replication) while this node keeps serving
   the slots.  The changes to those slots noted meanwhile follow.
2. Pause.  Commands on the moving slots wait (``ServerCore.pause_slots``:
   their connections' input is held; nothing is refused), and the changes
   noted until then go across, until a drain finds none.
3. Flip.  A new map version giving the slots to the target is installed
   on the target, then here (from then on this node answers MOVED, and
   the waiting commands are redirected), then on every other node.  The
   pause lasts from step 2 to here; it is measured.
4. This node deletes the moved buckets in the background (a bounded step
   per tick; the deletions reach its standbys as changes).

A bucket's state is copied, never reset: exhausted before, exhausted
after; a change made here during the copy is sent after it, and none can
be made during the pause, so nothing is spent twice or lost.  If the
target fails before the flip, the move is abandoned: the pause ends, the
running map and every bucket here are untouched, and the error says why.
Once the target was asked to take the new map the move is committed (it
may have taken it): an unconfirmed flip completes and says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import struct
import time
import zlib

from fastlimit._cluster import SLOTS
from fastlimit._core import SlotCursor
from fastlimit._resp import ReplyError
from fastlimit.cluster import slot_map as clustermap
from fastlimit.cluster.slot_map import MapError, SlotMap, SlotRange
from fastlimit.lazy_redis import redis
from fastlimit.server import snapshot
from fastlimit.server.subsystem import Subsystem

# Time for one step of the walk over the tables, or of the deletion.
STEP_MS = 2.0
# Bytes of records per CL.CLUSTER IMPORT.
BATCH_BYTES = 256 * 1024
# The copy's catch-up rounds go on while a round carries more than this,
# so the pause has little left to send.
SMALL_ROUND_BYTES = 16 * 1024
CATCH_UP_ROUNDS = 20
# The pause ends, the move abandoned, if the changes still come after this
# many rounds (a write path that does not wait for the pause).
PAUSE_ROUNDS = 5


@dataclasses.dataclass
class MoveStatus:
    """What CL.CLUSTER MOVESTATUS shows of the running or last move."""

    state: str = "none"       # copying, paused, flipping, pushing, done, abandoned, failed
    slots: str = ""
    target: str = ""
    map_version: int = 0
    buckets: int = 0          # sent by the copy
    changes: int = 0          # sent after it (changes made meanwhile)
    batches: int = 0          # CL.CLUSTER IMPORT calls
    copy_ms: float | None = None
    pause_ms: float | None = None   # the slots' commands waited this long
    flip_ms: float | None = None    # of which the map installs on the target and here
    waited: int = 0           # connections whose commands waited
    error: str = ""
    unreached: str = ""       # nodes that did not take the new map (they catch up)


class MoveError(Exception):
    """Why a move was abandoned (or refused before it began)."""


class Reshard(Subsystem):
    def __init__(self, app, log):
        self.app = app
        self.log = log
        self.mask: bytes | None = None       # the slots moving now
        self.pending: list[bytes] = []       # their changes drained, not sent yet
        self.status = MoveStatus()
        self.deleting: list[SlotCursor] = []  # each of app.stores', of moved slots
        self.task: asyncio.Task | None = None
        self.moves = 0

    # ---- the change log, shared with replication -------------------------------

    @property
    def tracking(self) -> bool:
        """Replication leaves the change log on while this is true."""
        return self.mask is not None

    def changes_drained(self, parts: list[bytes]) -> None:
        """Whoever drains the change log hands the drained sections here
        (replication's flush, or this module): the moving slots' part of
        them is kept to be sent."""
        if self.mask is None or not parts:
            return
        app = self.app
        for s in snapshot.parse_sections(memoryview(b"".join(parts))):
            owner = (app.store if s.name == b"check" else
                     app.windows.store if s.name.startswith(snapshot.WINDOWS_PREFIX) else
                     app.rule_engine)
            self.pending += owner.filter_section(self.mask, s.name, s.value_size, s.data,
                                                 s.records)

    def _replication_tracks(self) -> bool:
        repl = self.app.replication
        return bool(repl.followers) and repl.link is None

    def _start_tracking(self, mask: bytes) -> None:
        if not self._replication_tracks():
            for store in self.app.stores:
                store.track_changes(self.app.settings.repl_buffer_limit)
        self.mask = mask
        self.pending = []

    def _stop_tracking(self) -> None:
        self.mask = None
        self.pending = []
        if not self._replication_tracks():
            for store in self.app.stores:
                store.untrack_changes()

    def _take_changes(self) -> list[bytes]:
        """The moving slots' changes since the last call."""
        app = self.app
        self._check_log()
        if self._replication_tracks():
            app.replication.flush()        # its replicas get them too
        else:
            self.changes_drained([part for store in app.stores
                                  for part in store.drain_changes()])
        self._check_log()
        parts, self.pending = self.pending, []
        return parts

    def _check_log(self) -> None:
        if any(store.changes_overflowed() for store in self.app.stores):
            raise MoveError("the change log passed repl-buffer-limit during the move; "
                            "raise it or move fewer slots at a time")

    # ---- the command -------------------------------------------------------------

    async def move(self, slots: SlotRange, target: str) -> dict[str, object]:
        """CL.CLUSTER MOVE: the final status, or ReplyError naming why the
        move was refused or abandoned."""
        new_map, target_addr = self._plan(slots, target)
        self.task = asyncio.current_task()
        self.moves += 1
        try:
            await self._run(slots, new_map, target_addr)
        except MoveError as e:
            self._abandoned(str(e))
        except (redis.RedisError, OSError, TimeoutError) as e:
            self._abandoned(f"target {target_addr} failed: {type(e).__name__}: {e}")
        finally:
            self.task = None
        return self.move_status()

    def _abandoned(self, why: str) -> None:
        self.status.state, self.status.error = "abandoned", why
        self.log.warning("cluster: move of slots %s abandoned, map and buckets untouched: %s",
                         self.status.slots, why)
        raise ReplyError(f"ERR slot move abandoned, the map and every bucket untouched: {why}")

    def _plan(self, slots: SlotRange, target: str):
        """The new map and the target's primary; ReplyError if the move
        cannot be made from here."""
        cluster = self.app.cluster
        if self.task is not None:
            raise ReplyError("ERR a slot move is already running (CL.CLUSTER MOVESTATUS)")
        if self.deleting:
            raise ReplyError("ERR the last move's buckets are still being deleted here; "
                             "retry once CL.CLUSTER MOVESTATUS shows deleting:0")
        if not cluster.is_primary():
            raise ReplyError("ERR slots move from the primary serving them")
        core = self.app.core
        if not all(core.serves_slot(s) for s in range(slots.start, slots.end + 1)):
            raise ReplyError(f"ERR this node does not serve every slot of {slots}")
        names = [s.name for s in cluster.slot_map.shards]
        if target not in names:
            raise ReplyError(f"ERR no shard {target!r} in the slot map")
        if target == cluster.my_shard():
            raise ReplyError(f"ERR the slots are on shard {target!r} already")
        roles = cluster.roles.get(target)
        if roles is None:
            raise ReplyError(f"ERR shard {target!r} has no known primary")
        try:
            new_map = moved_map(cluster.slot_map, slots, names.index(target))
        except MapError as e:
            raise ReplyError(f"ERR {e}") from None
        return new_map, roles.primary

    async def _run(self, slots: SlotRange, new_map: SlotMap, target) -> None:
        cluster = self.app.cluster
        old_map = cluster.slot_map
        mask = slot_mask(slots)
        self.status = MoveStatus("copying", str(slots), str(target), new_map.version)
        started = time.monotonic()
        self._start_tracking(mask)
        try:
            await self._copy(target, mask)
            await self._catch_up(target)
            self.status.copy_ms = round((time.monotonic() - started) * 1000, 3)
            await self._pause_and_flip(target, new_map, mask)
        finally:
            self._stop_tracking()
        self.deleting = [SlotCursor(mask) for _ in self.app.stores]
        self.status.state = "pushing"
        others = [a for a in cluster.other_nodes(old_map, new_map) if a != target]
        replies = await cluster.peers.call_each(others, "CL.CLUSTER", "SETMAP",
                                                clustermap.dumps(new_map))
        self.status.unreached = ", ".join(
            str(a) for a, r in sorted(replies.items()) if isinstance(r, BaseException))
        self.status.state = "done"
        self.log.warning("cluster: slots %s moved to %s in %.1f ms (pause %.3f ms), %d "
                         "buckets and %d changes sent", slots, target,
                         (time.monotonic() - started) * 1000, self.status.pause_ms,
                         self.status.buckets, self.status.changes)

    async def _copy(self, target, mask: bytes) -> None:
        app = self.app
        batch: list[bytes] = []
        size = 0
        for table in app.stores:
            cursor = SlotCursor(mask)
            while not cursor.done:
                parts = table.export_slots(cursor, STEP_MS, BATCH_BYTES)
                batch += parts
                size += sum(len(p) for p in parts)
                if size >= BATCH_BYTES:
                    # Changes replication drained meanwhile go along: what
                    # is kept between sends is one batch interval's worth.
                    batch += self.pending
                    self.pending = []
                    self.status.buckets += await self._send(target, batch)
                    batch, size = [], 0
                await asyncio.sleep(0)     # the others' turn between steps
        if batch:
            self.status.buckets += await self._send(target, batch)

    async def _catch_up(self, target) -> None:
        """Sends the changes made during the copy, while they are many."""
        for _ in range(CATCH_UP_ROUNDS):
            parts = self._take_changes()
            if parts:
                self.status.changes += await self._send(target, parts)
            if sum(len(p) for p in parts) < SMALL_ROUND_BYTES:
                return

    async def _pause_and_flip(self, target, new_map: SlotMap, mask: bytes) -> None:
        app, cluster = self.app, self.app.cluster
        self.status.state = "paused"
        paused_at = time.monotonic()
        app.core.pause_slots(mask)
        try:
            for _ in range(PAUSE_ROUNDS):
                parts = self._take_changes()
                if not parts:
                    break
                self.status.changes += await self._send(target, parts)
            else:
                raise MoveError("the moving slots kept changing during the pause")
            self.status.state = "flipping"
            flip_at = time.monotonic()
            await self._flip_on(target, new_map)
            # Past the commit point.  A write no pause holds (a MULTI queued
            # before the pause) may have run meanwhile: it follows.
            late = self._take_changes()
            try:
                cluster.install(new_map)
            except MapError as e:    # a newer map arrived during the pause: it wins
                self.status.state, self.status.error = "failed", (
                    f"the target took map version {new_map.version} but this node "
                    f"refused it: {e}")
                raise ReplyError(f"ERR {self.status.error}") from None
            self.status.flip_ms = round((time.monotonic() - flip_at) * 1000, 3)
        finally:
            self.status.waited = app.core.slot_waiting_clients
            app.core.resume_slots()
            self.status.pause_ms = round((time.monotonic() - paused_at) * 1000, 3)
        if late:
            try:
                self.status.changes += await self._send(target, late)
            except (redis.RedisError, OSError, TimeoutError) as e:   # past the commit point
                self.status.error = f"late changes not sent to {target}: {e}"
                self.log.error("cluster: %s", self.status.error)

    async def _flip_on(self, target, new_map: SlotMap) -> None:
        """The target takes the new map.  An error reply (it refuses the
        map) abandons the move; no answer in time leaves it unknown whether
        it took it, so the flip goes on here and the status says so."""
        try:
            await self.app.cluster.peers.call(target, "CL.CLUSTER", "SETMAP",
                                              clustermap.dumps(new_map))
        except redis.ResponseError as e:
            raise MoveError(f"target {target} refused the new slot map: {e}") from None
        except (redis.RedisError, OSError, TimeoutError) as e:
            self.status.error = (f"target {target} did not confirm the new slot map "
                                    f"({type(e).__name__}); it takes it from a peer")

    async def _send(self, target, parts: list[bytes]) -> int:
        """One CL.CLUSTER IMPORT of sections; the buckets it carried."""
        blob = pack(self.app, parts)
        loaded = await self.app.cluster.peers.call(target, "CL.CLUSTER", "IMPORT", blob)
        self.status.batches += 1
        return int(loaded)

    # ---- the target's side -------------------------------------------------------

    def import_blob(self, blob: bytes) -> int:
        """CL.CLUSTER IMPORT: loads buckets sent by a moving shard; how many
        records the blob carried."""
        app = self.app
        if app.core.readonly:
            raise ReplyError("ERR moved slots go to a shard's primary")
        if self.deleting:
            raise ReplyError("ERR this node is still deleting slots it moved away; "
                             "retry once CL.CLUSTER MOVESTATUS shows deleting:0")
        try:
            snap = snapshot.decode(blob)
            renumber = snapshot.renumber_map(snap.rules, app.rules)
            snapshot.load_sections(snap.sections, app.store, app.rule_engine, renumber,
                                   deletes=True, windows=app.windows.store)
        except snapshot.SnapshotError as e:
            raise ReplyError(f"ERR unusable slot data: {e}") from None
        snapshot.advance_lease_generations(snap.lease_generations, app.rule_engine, renumber)
        return sum(s.records for s in snap.sections)

    # ---- after the flip: the moved buckets go --------------------------------------

    def tick(self) -> None:
        if not self.deleting:
            return
        app = self.app
        for table, cursor in zip(app.stores, self.deleting, strict=True):
            if not cursor.done:
                table.delete_slots(cursor, STEP_MS / 2)
                return
        self.log.info("cluster: moved buckets deleted (%d)",
                      sum(c.records for c in self.deleting))
        self.deleting = []

    def move_status(self) -> dict[str, object]:
        status: dict[str, object] = dataclasses.asdict(self.status)
        status["deleting"] = 1 if self.deleting else 0
        return status

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def info_sections(self, sections, named):
        if not self.app.cluster.enabled:
            return {}
        pause = self.status.pause_ms
        return {"cluster": {"cluster_moves": self.moves,
                            "cluster_move_state": self.status.state,
                            "cluster_move_last_pause_ms": pause if pause is not None else -1},
                "memory": {"mem_slot_move_pending": sum(len(p) for p in self.pending)}}


def slot_mask(slots: SlotRange) -> bytes:
    mask = bytearray(SLOTS)
    mask[slots.start:slots.end + 1] = b"\x01" * (slots.end - slots.start + 1)
    return bytes(mask)


def moved_map(old: SlotMap, slots: SlotRange, target: int) -> SlotMap:
    """old with slots given to shard number target, one version newer."""
    owner = list(old.owner)
    owner[slots.start:slots.end + 1] = [target] * (slots.end - slots.start + 1)
    shards = [dataclasses.replace(shard, slots=slot_ranges(owner, i))
              for i, shard in enumerate(old.shards)]
    return SlotMap.build(old.version + 1, shards, old.sentinels, old.pinned_ids)


def slot_ranges(owner: list[int], shard: int) -> tuple[SlotRange, ...]:
    ranges: list[SlotRange] = []
    start = None
    for slot in range(SLOTS + 1):
        mine = slot < SLOTS and owner[slot] == shard
        if mine and start is None:
            start = slot
        elif not mine and start is not None:
            ranges.append(SlotRange(start, slot - 1))
            start = None
    return tuple(ranges)


def pack(app, parts: list[bytes]) -> bytes:
    """Sections in the snapshot file's envelope (snapshot.write_to's): the
    rule numbers they use, checked by a CRC, so the target loads them with
    snapshot.decode and load_sections."""
    engine = app.rule_engine
    meta = json.dumps({"created_ms": app.clock.now(),
                       "rules": {str(n): list(r)
                                 for n, r in snapshot.rule_numbers(app.rules).items()},
                       "lease_generations": {str(n): g for n, g in
                                             engine.lease_generations().items()}}).encode()
    body = b"".join([snapshot.MAGIC, struct.pack("<I", len(meta)), meta, *parts])
    return body + struct.pack("<I", zlib.crc32(body)) + snapshot.FOOTER
