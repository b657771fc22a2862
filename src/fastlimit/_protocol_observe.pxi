# Included by _protocol.pyx: the observers of the commands run, MONITOR (and
# WATCH's side of it, telling the watchers of the keys a write names): while
# nobody monitors or watches, Connection.run costs one test of a C int and
# nothing here runs.  Declared in _protocol.pxd.


cdef void run_observed(Connection c, Command cmd, list args):
    """run() while some client monitors or watches: after the command,
    the monitors get its line (EXEC's after the commands it ran, as in
    Redis) and the watchers of the keys a write names are told."""
    cdef list seen = args if args is not None else c.args_as_bytes()
    cdef ServerCore core = c.core
    c.dispatch(cmd, args)
    if core.monitors:
        feed_monitors(c, cmd, seen)
    if core.watched_keys and cmd.is_write and cmd.first_key:
        touch_watched_keys(core, command_keys(cmd, seen))


cdef void feed_monitors(Connection c, Command cmd, list args):
    """Redis's replicationFeedMonitors line, to every monitor; admin
    commands are not shown (nor their subcommands), AUTH and HELLO's
    credentials are redacted.  A monitor whose output passes its limits
    is dropped by push(), as any client."""
    cdef Connection m
    if "admin" in cmd.flags:
        return
    if cmd.subcommands and len(args) > 1:
        sub = cmd.subcommands.get(args[1].lower())
        if sub is not None and "admin" in (<Command>sub).flags:
            return
    line = monitor_line(c.addr, redacted(args))
    for m in list(c.core.monitors.values()):
        m.push(line)


cdef int monitor_start(Connection c) except -1:
    """MONITOR: from now on this client gets every command's line."""
    if not c.monitoring:
        c.monitoring = True
        c.core.monitors[c.id] = c
        c.core.observers += 1
    return 0


cdef int monitor_stop(Connection c) except -1:
    if c.monitoring:
        c.monitoring = False
        del c.core.monitors[c.id]
        c.core.observers -= 1
    return 0


def command_keys(Command cmd, list args):
    """The key arguments of a command, by its table entry's key positions."""
    cdef int last = cmd.last_key if cmd.last_key >= 0 else len(args) + cmd.last_key
    cdef int step = cmd.key_step if cmd.key_step > 0 else 1
    return args[cmd.first_key:last + 1:step]


def redacted(list args):
    """args as MONITOR shows them: AUTH's and HELLO AUTH's credentials
    replaced by "(redacted)", where Redis's handlers redact them."""
    name = args[0].lower()
    if name == b"auth" and len(args) <= 3:
        return args[:1] + [b"(redacted)"] * (len(args) - 1)
    if name != b"hello" or len(args) < 2 or args[1] not in (b"2", b"3"):
        return args
    out = list(args)
    i = 2
    while i < len(out):
        option = out[i].lower()
        if option == b"auth" and len(out) - 1 - i >= 2:
            out[i + 1] = out[i + 2] = b"(redacted)"
            i += 3
        elif option == b"setname" and len(out) - 1 - i >= 1:
            i += 2
        else:
            break     # Redis stops at the syntax error
    return out


def monitor_line(str addr, list args):
    """"+<unix time with us> [0 <addr>] "arg" ...": Redis's MONITOR line, each
    argument quoted as its sdscatrepr quotes it."""
    now = time.time()
    sec = int(now)
    head = b"+%d.%06d [0 %s] " % (sec, int((now - sec) * 1e6), addr.encode())
    return head + b" ".join(quoted(a) for a in args) + b"\r\n"


_REPR = {0x5c: b"\\\\", 0x22: b'\\"', 0x0a: b"\\n", 0x0d: b"\\r", 0x09: b"\\t",
         0x07: b"\\a", 0x08: b"\\b"}


def quoted(bytes a):
    """Redis's sdscatrepr: printable bytes as they are, the rest escaped."""
    cdef unsigned char c
    out = bytearray(b'"')
    for c in a:
        if c in _REPR:
            out += _REPR[c]
        elif 0x20 <= c <= 0x7e:
            out.append(c)
        else:
            out += b"\\x%02x" % c
    out.append(0x22)
    return bytes(out)
