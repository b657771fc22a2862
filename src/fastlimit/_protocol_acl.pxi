# Included by _protocol.pyx: the authorization gate, as Redis's acl.c: what
# a user may run on which keys (acl_verdict, which every front asks), the
# RESP connection's refusal and ACL LOG entry (acl_denied), and the
# credentials an HTTP or gRPC request carries.  The users themselves are
# acl/users.py's.  Declared in _protocol.pxd.


cdef extern from "Python.h":
    # Borrowed, unchecked: the ACL check reads its own tuples of bytes.
    PyObject* tuple_item "PyTuple_GET_ITEM"(PyObject* t, Py_ssize_t i)
    Py_ssize_t tuple_size "PyTuple_GET_SIZE"(PyObject* t)
    char* bytes_data "PyBytes_AS_STRING"(PyObject* b)
    Py_ssize_t bytes_size "PyBytes_GET_SIZE"(PyObject* b)


cdef inline bint key_admitted(tuple keys, const Arg* key) noexcept:
    """Whether keys (acl/users.py's (prefixes, globs): a pattern that is a
    literal then one "*" is a prefix, compared with memcmp; the others
    are globs) admit key."""
    cdef PyObject* group
    cdef PyObject* p
    cdef Py_ssize_t j, n
    group = tuple_item(<PyObject*>keys, 0)
    for j in range(tuple_size(group)):
        p = tuple_item(group, j)
        n = bytes_size(p)
        # (an empty key matches no pattern, as in stringmatchlen)
        if key.len > 0 and <Py_ssize_t>key.len >= n and memcmp(bytes_data(p), key.ptr, n) == 0:
            return True
    group = tuple_item(<PyObject*>keys, 1)
    for j in range(tuple_size(group)):
        p = tuple_item(group, j)
        if glob_match(bytes_data(p), bytes_size(p), key.ptr, key.len):
            return True
    return False


cdef int acl_verdict(bytes perm, tuple keys, Command cmd, const Arg* argv, int argc) except -2:
    """Whether an ACL grant (permission map, and key patterns as
    key_admitted reads them or None for all keys; see acl/users.py)
    admits cmd (the subcommand, for a container) with argv: 0 when it
    does, -1 when the command is not allowed, else the position of the
    first key (first_key..last_key by key_step, as COMMAND shows them)
    no pattern admits.  Every front asks this."""
    cdef int i, last
    if cmd.acl_id >= PyBytes_GET_SIZE(perm) or not (<const unsigned char*>PyBytes_AS_STRING(
            perm))[cmd.acl_id]:
        return -1
    if keys is None or cmd.first_key <= 0:
        return 0
    last = cmd.last_key if cmd.last_key >= 0 else argc + cmd.last_key
    if last > argc - 1:
        last = argc - 1
    i = cmd.first_key
    while i <= last:
        if not key_admitted(keys, &argv[i]):
            return i
        i += cmd.key_step if cmd.key_step > 0 else 1
    return 0


# Redis's reasons (multi.c) when EXEC finds a queued command no longer allowed.
EXEC_DENIALS = {"command": "no permission to execute the command or subcommand",
                "key": "no permission to touch the specified keys",
                "channel": "no permission to access one of the channels used as arguments"}


cdef bint acl_denied(Connection c, Command cmd, bint at_exec):
    """For a restricted user: refuses (and logs in ACL LOG) the command
    in parser.argv if the user may not run it or touch one of its keys,
    as Redis's ACLCheckAllPerm; a container is judged by its
    subcommand (CONFIG|SET).  at_exec: EXEC running what MULTI queued,
    whose reply is Redis's "rules changed" NOPERM."""
    cdef Command target = cmd
    cdef Command sub
    cdef int pos = 0
    if cmd.no_auth:
        return False     # AUTH, HELLO, QUIT, RESET and CL.PEERAUTH (the table's only no-auth ones), as Redis
    if cmd.subcommands and c.parser.argc >= 2:
        sub = cmd.subcommands.get(PyBytes_FromStringAndSize(
            c.parser.argv[1].ptr, c.parser.argv[1].len).lower())
        if sub is None or not sub.arity_ok(c.parser.argc):
            return False     # the container's own error comes next
        target = sub
    pos = acl_verdict(c.acl_perm, c.acl_keys, target, c.parser.argv, c.parser.argc)
    reason = "key"
    if pos == 0 and target.has_channels and c.acl_channels is not None:
        pos = c.core.app.acl.channel_position(c.acl_channels, target, c.args_as_bytes())
        reason = "channel"
    if pos == 0:
        return False
    if pos < 0:
        reason, obj = "command", target.name
    else:
        obj = arg_text(&c.parser.argv[pos], 1 << 30)
    c.core.app.acl.log_denial(c, reason, obj, at_exec or c.multi_queue is not None)
    if at_exec:
        c.reply_error("NOPERM ACLs rules changed between the moment the transaction was "
                      "accumulated and the EXEC call. This command is no longer allowed "
                      "for the following reason: " + EXEC_DENIALS[reason])
    elif pos < 0:
        c.reject(cmd, f"NOPERM this user has no permissions to run the '{target.name}' "
                      "command")
    else:
        c.reject(cmd, f"NOPERM this user has no permissions to access one of the "
                      f"{reason}s used as arguments")
    return True


cdef int acl_set_user(Connection c, user, bint authenticated) except -1:
    """Runs as user (acl/users.py's User, or None: unrestricted) from
    now on; its grant is None when it may run everything on every key
    and channel, else (permission map, key patterns or None, channel
    patterns or None); its priority (acl/rules.py's User.priority) is
    its checks' default and the highest they may ask for."""
    grant = user.grant if user is not None else None
    c.user = user
    c.authenticated = authenticated
    c.restricted = grant is not None
    c.acl_perm, c.acl_keys, c.acl_channels = \
        grant if grant is not None else (None, None, None)
    priority = user.priority if user is not None else None
    c.user_priority = FL_PRIO_UNSET if priority is None else priority
    c.priority = FL_PRIO_NORMAL if priority is None else priority
    return 0


def acl_check(grant, Command cmd, list args):
    """acl_verdict for Python callers (ACL DRYRUN, the HTTP front): args
    are the command's bytes, args[0] its name.  None: unrestricted."""
    cdef int i, argc = len(args)
    cdef Arg* argv
    cdef bytes a
    if grant is None:
        return 0
    argv = <Arg*>malloc(sizeof(Arg) * (argc if argc > 0 else 1))
    if argv == NULL:
        raise MemoryError()
    try:
        for i in range(argc):
            a = args[i]
            argv[i].ptr = PyBytes_AS_STRING(a)
            argv[i].len = PyBytes_GET_SIZE(a)
        return acl_verdict(grant[0], grant[1], cmd, argv, argc)   # (channels: acl.py's)
    finally:
        free(argv)


# ---- what an HTTP or gRPC request says of its caller (neither front imports the other) ----

def credentials(bytes header):
    """(user name, password) of an Authorization header: Basic
    base64(user:password), whose empty user name is the default user, or
    "Bearer <password>", the default user's password (requirepass); None
    for anything else."""
    scheme, _, value = header.strip().partition(b" ")
    value = value.strip()
    scheme = scheme.lower()
    if scheme == b"bearer":
        return "default", value
    if scheme == b"basic":
        try:
            decoded = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return None
        user, _, password = decoded.partition(b":")
        return user.decode("utf-8", "surrogateescape") or "default", password
    return None


def peer_text(peer):
    """A transport's peername as ACL LOG's client info (addr=) writes it."""
    return _format_addr(peer) if isinstance(peer, tuple) else ""
