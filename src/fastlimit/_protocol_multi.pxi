# Included by _protocol.pyx: transactions, as Redis's multi.c: MULTI queues
# the commands EXEC runs back to back (DISCARD drops them), and WATCH makes
# EXEC abort when a write names a watched key before it.  Declared in
# _protocol.pxd; Connection.watch/unwatch and ServerCore.touch_keys and
# touch_all_watched are Python's way in.


cdef void begin_multi(Connection c):
    if c.multi_queue is not None:
        c.reply_error("ERR MULTI calls can not be nested")
        return
    c.multi_queue = []
    c.multi_dirty = False
    write_raw(&OUT, b"+OK\r\n", 5)


cdef void queue_in_multi(Connection c, Command cmd):
    if cmd.not_queued:
        c.run(cmd, None)
        return
    c.multi_queue.append((cmd, c.args_as_bytes()))
    write_raw(&OUT, b"+QUEUED\r\n", 9)


cdef void discard_multi(Connection c):
    if c.multi_queue is None:
        c.reply_error("ERR DISCARD without MULTI")
        return
    c.multi_queue = None
    c.multi_dirty = False
    unwatch_all(c)
    write_raw(&OUT, b"+OK\r\n", 5)


cdef void exec_queued(Connection c):
    """Runs the queued commands back to back: the server is
    single-threaded, so nothing interleaves with them."""
    cdef list queued = c.multi_queue
    cdef Command cmd
    cdef list args
    cdef bytes arg
    cdef int i
    cdef int64_t started
    if queued is None:
        c.reply_error("ERR EXEC without MULTI")
        return
    c.multi_queue = None
    dirty = c.watch_dirty
    unwatch_all(c)    # as Redis, before the commands run: they touch no watch of its own
    if c.multi_dirty:
        c.multi_dirty = False
        c.reply_error("EXECABORT Transaction discarded because of previous errors.")
        return
    if dirty:
        # a watched key changed: the null array (RESP3's null)
        if c.proto == 3:
            write_raw(&OUT, b"_\r\n", 3)
        else:
            write_raw(&OUT, b"*-1\r\n", 5)
        return
    if c.core.readonly and any(q.is_write and not q.replica_peeks for q, _ in queued):
        # queued before the server became a replica (as Redis answers)
        c.reply_error("ERR Transaction contains write commands but instance is now "
                      "a read-only replica. EXEC aborted.")
        return
    write_prefixed_int(&OUT, c'*', len(queued))
    for cmd, args in queued:
        if parser_reserve(&c.parser, len(args)) != 0:
            c.reply_error("OOM out of memory")
            continue
        for i, arg in enumerate(args):
            c.parser.argv[i].ptr = PyBytes_AS_STRING(arg)
            c.parser.argv[i].len = PyBytes_GET_SIZE(arg)
        c.parser.argc = len(args)
        if c.restricted and acl_denied(c, cmd, True):
            continue      # its rules changed since it was queued
        started = fl_mono_ns()
        c.in_exec = True       # no command may wait (ask_home): EXEC runs as one
        try:
            c.run(cmd, args)
        finally:
            c.in_exec = False
        record_call(cmd, fl_mono_ns() - started)   # each its own call; EXEC's holds them all


cdef int watch_keys(Connection c, keys) except -1:
    """WATCH: EXEC aborts if a write names one of keys before it."""
    cdef ServerCore core = c.core
    if c.watching is None:
        c.watching = {}
    for key in keys:
        if key in c.watching:
            continue
        c.watching[key] = None
        watchers = core.watched_keys.get(key)
        if watchers is None:
            watchers = core.watched_keys[key] = {}
            core.observers += 1
        watchers[c.id] = c
    return 0


cdef int unwatch_all(Connection c) except -1:
    """Forgets every watched key (UNWATCH, EXEC, DISCARD, RESET, and a
    connection closed)."""
    cdef ServerCore core = c.core
    c.watch_dirty = False
    if c.watching is None:
        return 0
    for key in c.watching:
        watchers = core.watched_keys[key]
        del watchers[c.id]
        if not watchers:
            del core.watched_keys[key]
            core.observers -= 1
    c.watching = None
    return 0


cdef int touch_watched_keys(ServerCore core, keys) except -1:
    """The buckets named by keys changed; their watchers' EXEC will
    abort."""
    cdef Connection c
    for key in keys:
        watchers = core.watched_keys.get(key)
        if watchers:
            for c in watchers.values():
                c.watch_dirty = True
    return 0


cdef int touch_all_watched_keys(ServerCore core) except -1:
    """Every watched bucket changed (FLUSHALL).  An absent bucket reads
    as a full one, so each watched key counts as touched."""
    return touch_watched_keys(core, list(core.watched_keys))
