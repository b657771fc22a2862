# Included by _protocol.pyx: cluster routing, as Redis's getNodeByQuery: a
# keyed command for a slot this node does not serve as primary is
# redirected, and one for a paused slot (the last step of a slot move) waits
# until the pause ends.  cluster/subsystem.py sets the routing and the pauses
# through ServerCore's methods, which call the functions here.  Declared in
# _protocol.pxd (but the inline ones).


# ServerCore.slot_served values.
cdef enum:
    SLOT_NOT_SERVED = 0
    SLOT_SERVED = 1
    SLOT_PAUSED = 2

# Connection.sliced while its next command waits for a paused slot: like a
# sliced reply, it holds the input and the commands after it.
SLOT_WAIT = object()


cdef int set_slot_routing(ServerCore core, served, shard_of_slot, list moved_to) except -1:
    """Cluster routing: served[slot] is true where this node serves the
    slot as primary, shard_of_slot[slot] the slot's shard index (both
    of CLUSTER_SLOTS entries), moved_to the redirect target per shard.
    None for all three turns routing off (standalone)."""
    cdef int slot
    if moved_to is None:
        core.cluster_routing = False
        core.moved_to = None
        core.rules.local_slots = NULL       # split keys: every sub-bucket is here
        return 0
    if len(served) != CLUSTER_SLOTS or len(shard_of_slot) != CLUSTER_SLOTS:
        raise ValueError(f"routing needs {CLUSTER_SLOTS} entries per slot")
    for slot in range(CLUSTER_SLOTS):
        if not 0 <= shard_of_slot[slot] < len(moved_to):
            raise ValueError(f"slot {slot}: no shard {shard_of_slot[slot]}")
    for slot in range(CLUSTER_SLOTS):
        # A pause outlives a routing change for the slots still served.
        core.slot_served[slot] = SLOT_NOT_SERVED if not served[slot] else (
            SLOT_PAUSED if core.slot_served[slot] == SLOT_PAUSED else SLOT_SERVED)
        core.slot_shard[slot] = shard_of_slot[slot]
    core.moved_to = list(moved_to)
    core.cluster_routing = True
    # split keys: a sub-bucket is checked where its sub-key's slot is served
    core.rules.local_slots = <const unsigned char*>core.slot_served
    return 0


cdef inline str slot_route_error(ServerCore core, const char* key, size_t n):
    """In cluster mode, None when this node serves the key's slot as
    primary, else the error a client is redirected with: MOVED,
    CLUSTERDOWN, or TRYAGAIN while the slot is paused (a front that
    cannot hold a request, as RESP does, asks the client to retry)."""
    cdef int slot
    if not core.cluster_routing:
        return None
    slot = key_slot(key, n)
    if core.slot_served[slot] == SLOT_SERVED:
        return None
    if core.slot_served[slot] == SLOT_PAUSED:
        return "TRYAGAIN the slot is moving to another shard"
    target = core.moved_to[core.slot_shard[slot]]
    return "CLUSTERDOWN Hash slot not served" if target is None else f"MOVED {slot} {target}"


cdef int pause_served_slots(ServerCore core, mask) except -1:
    """Commands on the served slots set in mask (CLUSTER_SLOTS bytes)
    wait from now until they are resumed; returns how many were paused."""
    cdef int slot, paused = 0
    if not core.cluster_routing or len(mask) != CLUSTER_SLOTS:
        raise ValueError("pausing slots needs cluster routing and a slot mask")
    for slot in range(CLUSTER_SLOTS):
        if mask[slot] and core.slot_served[slot] == SLOT_SERVED:
            core.slot_served[slot] = SLOT_PAUSED
            paused += 1
    return paused


cdef int resume_paused_slots(ServerCore core) except -1:
    """Ends every pause; the waiting commands run (or are redirected,
    if their slot moved meanwhile), each connection on its own turn."""
    cdef int slot
    cdef Connection conn
    for slot in range(CLUSTER_SLOTS):
        if core.slot_served[slot] == SLOT_PAUSED:
            core.slot_served[slot] = SLOT_SERVED
    waiters, core.slot_waiters = core.slot_waiters, {}
    loop = asyncio.get_running_loop()
    for conn in waiters.values():
        if conn.waits_for_slot and requeue_waiting(conn):
            loop.call_soon(conn.next_turn)
    return 0


cdef bint slot_runs_here(ServerCore core, int slot) except -1:
    """Whether a keyed command for slot runs here (always, standalone)."""
    if not 0 <= slot < CLUSTER_SLOTS:
        raise ValueError("slot out of range")
    return not core.cluster_routing or bool(core.slot_served[slot])


cdef inline bint serves_key(Connection c, Command cmd) noexcept:
    """Whether this node serves the slot of the command's key as primary
    (Redis Cluster's routing, before the command runs or is queued)."""
    cdef const Arg* key
    if cmd.first_key >= c.parser.argc:
        return True
    key = &c.parser.argv[cmd.first_key]
    return c.core.slot_served[key_slot(key.ptr, key.len)] == SLOT_SERVED


cdef void redirect(Connection c, Command cmd):
    """-MOVED to the primary serving the key's slot (a standby redirects
    too: clients handle MOVED alike, READONLY not), or CLUSTERDOWN when
    the slot's shard has no known primary.  Refused like any command,
    so MULTI fails at EXEC as in Redis.  A paused slot's command waits
    instead (see pause_served_slots)."""
    cdef const Arg* key = &c.parser.argv[cmd.first_key]
    cdef int slot = key_slot(key.ptr, key.len)
    if c.core.slot_served[slot] == SLOT_PAUSED:
        wait_for_slot(c)
        return
    target = c.core.moved_to[c.core.slot_shard[slot]]
    if target is None:
        c.reject(cmd, "CLUSTERDOWN Hash slot not served")
    else:
        c.reject(cmd, f"MOVED {slot} {target}")


cdef void wait_for_slot(Connection c):
    """The command just parsed waits for its slot's pause to end: no
    reply; a copy of it (as a multibulk) goes back in front of the
    buffer when the pause ends (requeue_waiting), and what follows it
    waits as after a sliced reply.  All of it off the path of commands
    that run: run_commands is untouched."""
    cdef int i
    cdef const Arg* a
    parts = [b"*%d\r\n" % c.parser.argc]
    for i in range(c.parser.argc):
        a = &c.parser.argv[i]
        parts.append(b"$%d\r\n%s\r\n" % (a.len, a.ptr[:a.len]))
    c.waiting_command = b"".join(parts)
    c.sliced = SLOT_WAIT
    c.waits_for_slot = True
    c.core.slot_waiters[c.id] = c


cdef bint requeue_waiting(Connection c):
    """Puts the waiting command back before the rest of the buffer;
    False if the connection is closed for want of memory."""
    cdef bytes command = c.waiting_command
    cdef size_t n = PyBytes_GET_SIZE(command)
    cdef char* grown
    c.waiting_command = None
    c.waits_for_slot = False
    c.sliced = None
    if c.inlen + n > c.incap:
        grown = <char*>realloc(c.inbuf, c.inlen + n)
        if grown == NULL:
            c.core.log.error("client id=%d: out of memory for its query buffer", c.id)
            c.abort()
            return False
        c.inbuf = grown
        c.incap = c.inlen + n
    memmove(c.inbuf + n, c.inbuf, c.inlen)
    memcpy(c.inbuf, PyBytes_AS_STRING(command), n)
    c.inlen += n
    c.more_input = True
    return True
