# Included by _protocol.pyx: the commands that run entirely in C (CL.CHECK,
# CL.LIMIT, PING), from their arguments to their reply, and the decisions
# every front makes the same way (check_bucket, check_limit: RESP here, HTTP
# in _http.pyx).  Declared in _protocol.pxd.  This is the check path: keep
# it C, and measure a change with bench/check_path.py.


cdef inline bint eq_nocase(const Arg* a, const char* lower, size_t n) noexcept:
    cdef size_t i
    cdef char c
    if a.len != n:
        return False
    for i in range(n):
        c = a.ptr[i]
        if c'A' <= c <= c'Z':
            c = c + 32
        if c != lower[i]:
            return False
    return True


cdef enum OptionStatus:
    OPT_OK = 0
    OPT_NEEDS_VALUE = 1
    OPT_UNKNOWN = 2
    OPT_BAD_CAPACITY = 3
    OPT_BAD_REFILL = 4
    OPT_BAD_COST = 5
    OPT_BAD_PERIOD = 6
    OPT_BAD_LIMIT_COST = 7
    OPT_BAD_SPLIT = 8
    OPT_BAD_PRIORITY = 9


cdef struct LimitArgs:
    const char* tier
    size_t tlen
    int64_t cost
    bint detail
    int priority              # FL_PRIO_UNSET: not asked


cdef inline int read_priority(const Arg* value, int* priority) noexcept:
    priority[0] = fl_priority_parse(value.ptr, value.len)
    return OPT_BAD_PRIORITY if priority[0] == FL_PRIO_UNSET else OPT_OK


cdef int read_check_args(const Arg* a, int argc, BucketParams* bp, int* split,
                         int* priority, int* bad) noexcept:
    """CL.CHECK's numbers and options into bp, split and priority: OPT_OK,
    or what is wrong (with the option at a[*bad])."""
    cdef int i = 4
    cdef int64_t k
    bp.cost = 1
    split[0] = 1
    priority[0] = FL_PRIO_UNSET
    bp.period_ms = 1000
    if not parse_int64(a[2].ptr, a[2].len, &bp.capacity):
        return OPT_BAD_CAPACITY
    if not parse_int64(a[3].ptr, a[3].len, &bp.refill):
        return OPT_BAD_REFILL
    while i < argc:
        bad[0] = i
        if i + 1 >= argc:
            return OPT_NEEDS_VALUE
        if eq_nocase(&a[i], b"cost", 4):
            if not parse_int64(a[i + 1].ptr, a[i + 1].len, &bp.cost):
                return OPT_BAD_COST
        elif eq_nocase(&a[i], b"period", 6):
            if not parse_int64(a[i + 1].ptr, a[i + 1].len, &bp.period_ms):
                return OPT_BAD_PERIOD
        elif eq_nocase(&a[i], b"split", 5):
            if not parse_int64(a[i + 1].ptr, a[i + 1].len, &k) or not 1 <= k <= FL_SPLIT_MAX:
                return OPT_BAD_SPLIT
            split[0] = <int>k
        elif eq_nocase(&a[i], b"priority", 8):
            if read_priority(&a[i + 1], priority) != OPT_OK:
                return OPT_BAD_PRIORITY
        else:
            return OPT_UNKNOWN
        i += 2
    return OPT_OK


cdef int read_limit_args(const Arg* a, int argc, LimitArgs* la, int* bad) noexcept:
    """CL.LIMIT's options into la, as read_check_args."""
    cdef int i = 3
    la.tier = NULL
    la.tlen = 0
    la.cost = 1
    la.detail = False
    la.priority = FL_PRIO_UNSET
    while i < argc:
        bad[0] = i
        if eq_nocase(&a[i], b"detail", 6):
            la.detail = True
            i += 1
            continue
        if i + 1 >= argc:
            return OPT_NEEDS_VALUE
        if eq_nocase(&a[i], b"tier", 4):
            la.tier, la.tlen = a[i + 1].ptr, a[i + 1].len
        elif eq_nocase(&a[i], b"cost", 4):
            if not parse_int64(a[i + 1].ptr, a[i + 1].len, &la.cost) or la.cost < 0 \
                    or la.cost > MAX_CAPACITY:
                return OPT_BAD_LIMIT_COST
        elif eq_nocase(&a[i], b"priority", 8):
            if read_priority(&a[i + 1], &la.priority) != OPT_OK:
                return OPT_BAD_PRIORITY
        else:
            return OPT_UNKNOWN
        i += 2
    return OPT_OK


cdef str options_error(int status, const Arg* option, str expected):
    if status == OPT_BAD_CAPACITY:
        return "ERR capacity is not an integer or out of range"
    if status == OPT_BAD_REFILL:
        return "ERR refill_per_sec is not an integer or out of range"
    if status == OPT_BAD_COST:
        return "ERR COST is not an integer or out of range"
    if status == OPT_BAD_PERIOD:
        return "ERR PERIOD is not an integer or out of range"
    if status == OPT_BAD_LIMIT_COST:
        return "ERR COST must be an integer from 0 to 10^15"
    if status == OPT_BAD_SPLIT:
        return f"ERR SPLIT must be an integer from 1 to {FL_SPLIT_MAX}"
    if status == OPT_BAD_PRIORITY:
        return "ERR PRIORITY must be low, normal or critical"
    if status == OPT_NEEDS_VALUE:
        return f"ERR syntax error: option '{arg_text(option)}' needs a value"
    return f"ERR syntax error: unknown option '{arg_text(option)}', expected {expected}"


cdef inline int ask_priority(Connection c, int asked) noexcept:
    """What a check of c's that asked for `asked` (FL_PRIO_UNSET: nothing)
    runs at, before rules: at most its user's priority; and c reads in
    that class from now on."""
    if asked == FL_PRIO_UNSET:
        asked = c.user_priority if c.user_priority != FL_PRIO_UNSET else FL_PRIO_NORMAL
    elif c.user_priority != FL_PRIO_UNSET and asked > c.user_priority:
        asked = c.user_priority
    c.priority = asked
    return asked


cdef void cl_check(Connection c):
    """CL.CHECK <key> <capacity> <refill_per_sec> [COST n] [PERIOD ms] [SPLIT k]
    [PRIORITY p]"""
    cdef Arg* a = c.parser.argv
    cdef BucketParams bp
    cdef CheckResult r
    cdef int rc, bad = 0, split, priority
    rc = read_check_args(a, c.parser.argc, &bp, &split, &priority, &bad)
    if rc != OPT_OK:
        c.reply_error(options_error(rc, &a[bad], "COST, PERIOD, SPLIT or PRIORITY"))
        return
    error = check_bucket(c.core, a[1].ptr, a[1].len, &bp, split, ask_priority(c, priority),
                         c.now_ms, &r)
    if error is not None:
        c.reply_error(error)
        return
    write_check(c, &r)


cdef void write_check(Connection c, const CheckResult* r, int extra=0):
    """[allowed, limit, remaining, retry_after_ms, reset_after_ms], with
    room for `extra` more elements the caller writes after them."""
    write_prefixed_int(&OUT, c'*', 5 + extra)
    write_prefixed_int(&OUT, c':', r.allowed)
    write_prefixed_int(&OUT, c':', r.limit)
    write_prefixed_int(&OUT, c':', r.remaining)
    write_prefixed_int(&OUT, c':', r.retry_after_ms)
    write_prefixed_int(&OUT, c':', r.reset_after_ms)


cdef void cl_limit(Connection c):
    """CL.LIMIT <client_key> <resource> [TIER t] [COST n] [DETAIL] [PRIORITY p]"""
    cdef Arg* a = c.parser.argv
    cdef int n = 0, rc, bad = 0, asked, fallback
    cdef LimitArgs la
    cdef CheckResult r
    cdef RuleEngine rules = c.core.rules
    rc = read_limit_args(a, c.parser.argc, &la, &bad)
    if rc != OPT_OK:
        c.reply_error(options_error(rc, &a[bad], "TIER, COST, DETAIL or PRIORITY"))
        return
    fallback = ask_priority(c, la.priority)     # a rule's priority comes between the two
    asked = FL_PRIO_UNSET if la.priority == FL_PRIO_UNSET else fallback
    error = check_limit(c.core, a[1].ptr, a[1].len, a[2].ptr, a[2].len, la.tier, la.tlen,
                        la.cost, asked, fallback, c.now_ms, &r, &n)
    if error is not None:    # HOME_ELSEWHERE looked up only then: a global costs a check
        if error is HOME_ELSEWHERE:
            ask_home(c)
        else:
            c.reply_error(error)
        return
    if not la.detail:
        write_check(c, &r)
        return
    write_check(c, &r, 1)
    if r.remaining == FL_SHED_REMAINING:
        write_raw(&OUT, b"*0\r\n", 4)     # shed: no rule was checked
        return
    encode_reply(&OUT, c.core.app.rules_detail(rules.last_detail(n)), c.proto)


cdef void ping(Connection c):
    if c.parser.argc > 2:
        c.reply_error("ERR wrong number of arguments for 'ping' command")
        return
    if c.subscribed and c.proto == 2:
        # a subscribed RESP2 client tells replies from pushes by shape
        write_raw(&OUT, b"*2\r\n$4\r\npong\r\n", 14)
        if c.parser.argc == 1:
            write_raw(&OUT, b"$0\r\n\r\n", 6)
            return
    if c.parser.argc == 1:
        write_raw(&OUT, b"+PONG\r\n", 7)
    else:
        write_bulk(&OUT, c.parser.argv[1].ptr, c.parser.argv[1].len)


cdef bint queued_write(Connection c, Command cmd):
    """Whether a fast command queued in MULTI on a replica would write:
    CL.CHECK and CL.LIMIT with COST 0 are peeks, so they may run.  One
    whose options do not parse is queued, to fail at EXEC, and so is
    a peeking command with a Python handler, which refuses its own
    writes when it runs."""
    cdef BucketParams bp
    cdef LimitArgs la
    cdef int bad, split, priority
    if cmd.fast == FAST_CL_CHECK:
        return read_check_args(c.parser.argv, c.parser.argc, &bp, &split, &priority,
                               &bad) == OPT_OK \
            and bp.cost != 0
    if cmd.fast == FAST_CL_LIMIT:
        return read_limit_args(c.parser.argv, c.parser.argc, &la, &bad) == OPT_OK \
            and la.cost != 0
    return False


# ---- decisions every front makes the same way (RESP here, HTTP in _http.pyx) ----

cdef str check_bucket(ServerCore core, const char* key, size_t keylen, const BucketParams* bp,
                      int split, int priority, int64_t now_ms, CheckResult* r):
    """CL.CHECK's decision into r (split k ways when split > 1; shed, and
    allowed, when the node sheds this priority): None, or the error
    reply's text."""
    cdef const char* err = bucket_params_error(bp)
    if err != NULL:
        return "ERR " + err.decode()
    if core.readonly and bp.cost != 0:
        return READONLY_ERROR    # a replica answers peeks only
    if fl_load_sheds(core.load, priority):
        shed_result(core.load, priority, bp.capacity, False, r)
        return None
    if split > 1:
        return check_split_bucket(core, key, keylen, bp, split, now_ms, r)
    return check_one_bucket(core, key, keylen, bp, now_ms, r)


cdef inline str check_one_bucket(ServerCore core, const char* key, size_t keylen,
                                 const BucketParams* bp, int64_t now_ms, CheckResult* r):
    cdef int rc = bucket_check(&core.store.table, key, keylen, prefetched_hash(key), bp,
                               now_ms, not core.readonly, r)
    if rc != FL_OK:    # one test on the way of an answer
        if rc == FL_EKEYLEN:
            return "ERR key is longer than 65535 bytes"
        if rc == FL_EOOM:
            return OOM_ERROR
        return "OOM out of memory: the bucket could not be stored"
    if fl_hk_due(core.hot):    # the hot-key tracker: one check in its sample
        sample_bucket(core.hot, key, keylen, now_ms)
    return None


# A split check's scratch: the base key (when the key given is a sub-key),
# then room for a sub-key after it; grown as needed, never shrunk (one
# loop, one check at a time).
cdef char* SPLIT_SCRATCH = NULL
cdef size_t SPLIT_SCRATCH_CAP = 0
cdef uint64_t SPLIT_RNG = 0x9E3779B97F4A7C15


cdef str check_split_bucket(ServerCore core, const char* key, size_t keylen,
                            const BucketParams* bp, int k, int64_t now_ms, CheckResult* r):
    """CL.CHECK ... SPLIT k, as a split rule does it (fl_split.h): a
    sub-key ("user:42#3") names its sub-bucket, a plain key (or a sub-key
    past k, from a client still on a larger split) gets a random one
    (standalone; in cluster mode the client picks, the reply says how),
    and a denied sub-bucket gets one other try here.  The reply
    shows the whole bucket: its capacity, and k times the sub-bucket's
    remaining (an estimate)."""
    global SPLIT_SCRATCH, SPLIT_SCRATCH_CAP
    cdef BucketParams part = bp[0]
    cdef CheckResult alt
    cdef int index = -1, other
    cdef size_t at, baselen = keylen, need = 2 * (keylen + FL_SPLIT_SUFFIX_MAX)
    cdef char* grown
    cdef const char* base = key
    if bp.capacity < k:
        return "ERR SPLIT is more than the capacity: every sub-bucket needs a token"
    part.period_ms = bp.period_ms * k
    if bucket_params_error(&part) != NULL:
        return "ERR SPLIT makes a sub-bucket's period (PERIOD x SPLIT) out of range"
    if need > SPLIT_SCRATCH_CAP:
        grown = <char*>realloc(SPLIT_SCRATCH, need)
        if grown == NULL:
            return "OOM out of memory: the bucket could not be stored"
        SPLIT_SCRATCH, SPLIT_SCRATCH_CAP = grown, need
    if fl_split_parse(key, keylen, FL_SPLIT_MAX, &index, &at):
        baselen = fl_split_base(key, keylen, index, at, SPLIT_SCRATCH)
        base = SPLIT_SCRATCH
    if index >= k or index < 0:     # a plain key, or one of a larger split's
        if core.cluster_routing:
            return split_refused(k)
        index = <int>(fl_split_random(&SPLIT_RNG) % <uint64_t>k)
    error = check_sub_bucket(core, base, baselen, &part, bp.capacity, k, index, now_ms, r)
    if error is not None or r.allowed or bp.cost == 0:
        return error
    other = split_pick(&SPLIT_RNG, core.rules.local_slots, base, baselen, k, index,
                       SPLIT_SCRATCH + baselen + FL_SPLIT_SUFFIX_MAX)
    if other < 0:
        return None
    error = check_sub_bucket(core, base, baselen, &part, bp.capacity, k, other, now_ms, &alt)
    if error is None and alt.allowed:
        r[0] = alt
    return error


cdef str check_sub_bucket(ServerCore core, const char* base, size_t baselen,
                          BucketParams* part, int64_t capacity, int k, int i, int64_t now_ms,
                          CheckResult* r):
    """Sub-bucket i of base's (its share of the capacity), shown whole."""
    cdef char* sub = SPLIT_SCRATCH + baselen + FL_SPLIT_SUFFIX_MAX
    cdef size_t sublen = fl_split_subkey(base, baselen, i, sub)
    part.capacity = fl_split_share(capacity, k, i)
    error = check_one_bucket(core, sub, sublen, part, now_ms, r)
    r.limit = capacity
    r.remaining = min(r.remaining * k, capacity)
    return error


cdef void sample_bucket(fl_hk* hot, const char* key, size_t keylen, int64_t now_ms) noexcept:
    if fl_hk_begin(hot, now_ms):
        fl_hk_count(hot, FL_HK_BUCKET, key, keylen)


cdef str check_limit(ServerCore core, const char* client, size_t clen, const char* resource,
                     size_t rlen, const char* tier, size_t tlen, int64_t cost, int asked,
                     int fallback, int64_t now_ms, CheckResult* r, int* nrules):
    """CL.LIMIT's decision over the matching rules (*nrules of them, for
    DETAIL) into r: None, or the error reply's text.  Shed (before any
    bucket is read) at the priority asked, else the rules', else
    fallback; allowed unless a rule fails closed."""
    cdef RuleEngine rules = core.rules
    cdef int rc
    if core.readonly and cost != 0:
        return READONLY_ERROR
    try:
        nrules[0] = rules.select_rules(client, clen, resource, rlen, tier, tlen)
        if core.load.level and shed_limit(core, rules, nrules[0], asked, fallback, r):
            return None
        rc = rules.evaluate(client, clen, resource, rlen, nrules[0], cost, now_ms, r)
    except ValueError as e:
        return f"ERR {e}"
    if rc != FL_OK:    # one test on the way of an answer
        if rc == FL_EKEYLEN:
            return "ERR client key and resource are longer than 65535 bytes"
        if rc == FL_EOOM:
            return OOM_ERROR
        if rc == FL_ESPLIT or rc == FL_ESPLITMIX:
            return rules.split_error(rc)
        if rc == FL_EHOME:
            return HOME_ELSEWHERE
        if rc == FL_EHOMEDOWN:
            if rules.home_allowing:     # a local allowance, maybe: rules/commands.py decides
                return HOME_ELSEWHERE
            home_unreachable(rules.home_fail_closed, r)
            return None
        return "OOM out of memory: the bucket could not be stored"
    return None    # the engine fed the hot-key tracker (RuleEngine.evaluate)


# ---- home rules (README, "Home rules"): a check whose key lives elsewhere -----------

# check_limit's answer for a check another region answers (FL_EHOME)
HOME_ELSEWHERE = "HOME"


cdef void ask_home(Connection c):
    """CL.LIMIT of a home rule whose key lives in another region: its
    Python handler (rules/commands.py cmd_limit) asks that region and
    answers when it has, holding this connection's later commands as any
    Awaited reply does; inside EXEC it cannot wait."""
    if c.in_exec:
        c.reply_error("ERR a home rule's check waits on its home region, which it cannot "
                      "do inside MULTI")
        return
    c.run_python(c.core.commands[b"cl.limit"], None)


cdef void home_unreachable(bint fail_closed, CheckResult* r) noexcept:
    """The answer to a check whose home region is unreachable: not
    counted (remaining FL_SHED_REMAINING, as a shed check's), allowed
    unless its rules fail closed."""
    r.allowed = not fail_closed
    r.limit = -1
    r.remaining = FL_SHED_REMAINING
    r.retry_after_ms = FL_SHED_RETRY_MS if fail_closed else 0
    r.reset_after_ms = 0


# ---- shedding (fl_load.h): what a shed check answers -----------------------------

cdef bint shed_limit(ServerCore core, RuleEngine rules, int n, int asked, int fallback,
                     CheckResult* r) noexcept:
    """Whether the rules' check is shed now, and if so its result."""
    cdef bint closed = False
    cdef int priority = asked
    cdef int ruled = rules.shed_policy(n, &closed)
    if priority == FL_PRIO_UNSET:
        priority = ruled if ruled != FL_PRIO_UNSET else fallback
    if not fl_load_sheds(core.load, priority):
        return False
    shed_result(core.load, priority, -1, closed, r)     # the limit: not looked up
    return True


cdef void shed_result(fl_load* load, int priority, int64_t limit, bint fail_closed,
                      CheckResult* r) noexcept:
    """A shed check's answer: not counted (remaining FL_SHED_REMAINING),
    allowed unless it fails closed."""
    r.allowed = not fail_closed
    r.limit = limit
    r.remaining = FL_SHED_REMAINING
    r.retry_after_ms = FL_SHED_RETRY_MS if fail_closed else 0
    r.reset_after_ms = 0
    fl_load_count_shed(load, priority, r.allowed)
