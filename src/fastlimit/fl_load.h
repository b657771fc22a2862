/* The saturation meter and the shed decision (overload/, issue 26).  Plain
 * C, no Python, nothing here fails: _load.pyx wraps it, the check path
 * (check_bucket, check_limit in _protocol_checks.pxi) reads one int of it
 * (fl_load_sheds), and the RESP front feeds it the bytes it holds back.
 *
 * Three signals, each cheap:
 *   - busy: the share of wall time the loop's thread spent on the CPU over
 *     the last window (CLOCK_THREAD_CPUTIME_ID: every front's work, the
 *     syscalls included, and nothing while it sleeps in epoll);
 *   - lag: how late the overload subsystem's probe timer fires, which is
 *     how long the loop's turns take;
 *   - wait: how long bytes a non-critical connection sent waited to be
 *     parsed while the node served others first (held-back bytes, counted
 *     in `pending_bytes`).
 * The probe (every FL_LOAD_PROBE_NS) closes a window every FL_LOAD_WINDOW_NS
 * and sets the level:
 *   0  nothing is shed;
 *   1  saturated (busy >= threshold_pct, or lag or wait >= lag_ns; once
 *      saturated, until busy is FL_LOAD_EXIT_MARGIN_PCT below): `low`
 *      checks are answered without touching their buckets, and the RESP
 *      front reads critical connections first;
 *   2  worse (busy, and lag or wait >= normal_lag_ns: answers would arrive
 *      after a caller's deadline, for FL_LOAD_HOLD_NS in a row): `normal`
 *      checks are shed too.  Only when normal_lag_ns is set: a shed check
 *      that fails open is not counted, so shedding normal checks lets a
 *      loaded node admit past the limits, which its operator must choose.
 * `critical` checks are never shed.  Level 1 begins at once and ends only
 * after the node was calm for FL_LOAD_HOLD_NS (no oscillation); level 2,
 * the costly one, needs its signals for that long and ends with them.
 */
#ifndef FL_LOAD_H
#define FL_LOAD_H

#include <stdint.h>
#include <string.h>
#include <time.h>

#define FL_PRIO_UNSET (-1)
#define FL_PRIO_LOW 0
#define FL_PRIO_NORMAL 1
#define FL_PRIO_CRITICAL 2
#define FL_PRIO_COUNT 3

#define FL_LOAD_PROBE_NS 5000000LL       /* the probe timer's period */
#define FL_LOAD_WINDOW_NS 20000000LL     /* busy is measured over this */
#define FL_LOAD_HOLD_NS 100000000LL      /* a level holds at least this long */
#define FL_LOAD_EXIT_MARGIN_PCT 10        /* saturated until this far below the threshold */
/* While saturated, the RESP front spends at most this much of a loop turn
 * on connections it held back, so a critical connection is read again
 * after at most about this long. */
#define FL_LOAD_DRAIN_NS 50000LL

/* A shed check's reply: remaining is FL_SHED_REMAINING (never a count), a
 * shed denial says to retry after FL_SHED_RETRY_MS. */
#define FL_SHED_REMAINING (-2)
#define FL_SHED_RETRY_MS 1000

typedef struct {
    int level;                 /* what the check path reads */
    int forced;                /* -1: measured; 0..2: DEBUG SHED-LEVEL's */
    /* settings (overload/subsystem.py) */
    int threshold_pct;         /* 0: shedding and reading order off */
    int64_t lag_ns;
    int64_t normal_lag_ns;
    /* the open window */
    int64_t window_start_ns;
    int64_t window_cpu_ns;
    int64_t window_lag_ns;     /* the longest lag and wait seen in it */
    int64_t window_wait_ns;
    int64_t due_ns;            /* when the probe should fire next */
    /* the last closed window, as INFO shows it */
    int busy_pct;
    int64_t last_lag_ns;
    int64_t last_wait_ns;
    /* held-back input (the RESP front) */
    int64_t pending_bytes;
    int64_t pending_conns;
    uint64_t deferrals;
    /* the level's history */
    int64_t calm_since_ns;     /* 0: the level is not about to fall */
    int64_t worse_since_ns;    /* 0: level 2's signals do not hold now */
    int64_t level_since_ns;
    uint64_t level_changes;
    uint64_t shed[FL_PRIO_COUNT][2];   /* [priority][allowed] */
} fl_load;

static inline int64_t fl_load_clock(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A window (and the probe's schedule) starting now: at the probes' start,
 * so the time the server took to start is not read as a late turn. */
static inline void fl_load_begin(fl_load* l) {
    int64_t now = fl_load_clock(CLOCK_MONOTONIC);
    l->window_start_ns = now;
    l->due_ns = now + FL_LOAD_PROBE_NS;
    l->window_cpu_ns = fl_load_clock(CLOCK_THREAD_CPUTIME_ID);
    l->window_lag_ns = l->window_wait_ns = 0;
}

static inline void fl_load_init(fl_load* l) {
    memset(l, 0, sizeof(*l));
    l->forced = -1;
    fl_load_begin(l);
    l->level_since_ns = l->window_start_ns;
}

/* A priority's name, any case ("low", "normal", "critical"), or
 * FL_PRIO_UNSET for anything else. */
static inline int fl_priority_parse(const char* p, size_t n) {
    static const char* const names[FL_PRIO_COUNT] = {"low", "normal", "critical"};
    int i;
    size_t j;
    for (i = 0; i < FL_PRIO_COUNT; i++) {
        if (strlen(names[i]) != n)
            continue;
        for (j = 0; j < n; j++) {
            char c = p[j];
            if (c >= 'A' && c <= 'Z')
                c += 32;
            if (c != names[i][j])
                break;
        }
        if (j == n)
            return i;
    }
    return FL_PRIO_UNSET;
}

/* Whether a check of this priority is shed now: one load and one compare. */
static inline int fl_load_sheds(const fl_load* l, int priority) {
    return priority < l->level;
}

/* The level the last window's signals ask for.  Level 2 needs the node
 * busy as well as late (a process the machine did not run for a while is
 * late but not saturated) and for a whole hold of windows in a row (a
 * turn that one large read made long is not a queue). */
static inline int fl_load_target(fl_load* l, int64_t now) {
    int64_t late = l->last_lag_ns > l->last_wait_ns ? l->last_lag_ns : l->last_wait_ns;
    /* Shedding lowers the load that saturated the node: a node past the
     * threshold stays saturated until it is clearly below it, or it would
     * leave and come back at every hold. */
    int margin = l->level >= 1 ? FL_LOAD_EXIT_MARGIN_PCT : 0;
    int busy = l->busy_pct >= l->threshold_pct - margin;
    if (l->threshold_pct <= 0)
        return 0;
    if (l->normal_lag_ns > 0 && busy && late >= l->normal_lag_ns) {
        if (l->worse_since_ns == 0)
            l->worse_since_ns = now;
        if (now - l->worse_since_ns >= FL_LOAD_HOLD_NS)
            return 2;
    } else {
        l->worse_since_ns = 0;
    }
    if (busy || late >= l->lag_ns)
        return 1;
    return 0;
}

static inline void fl_load_set_level(fl_load* l, int level, int64_t now) {
    if (level != l->level) {
        l->level = level;
        l->level_since_ns = now;
        l->level_changes++;
    }
    l->calm_since_ns = 0;
}

/* Moves the level toward target: up at once (level 2 once its signals
 * held, fl_load_target), from 2 down to 1 at once, to 0 once calm for the
 * hold. */
static inline void fl_load_settle(fl_load* l, int target, int64_t now) {
    if (l->forced >= 0 || target >= l->level) {
        fl_load_set_level(l, l->forced >= 0 ? l->forced : target, now);
        return;
    }
    if (l->level == 2)
        fl_load_set_level(l, 1, now);
    if (target == l->level)
        return;
    if (l->calm_since_ns == 0)
        l->calm_since_ns = now;
    if (now - l->calm_since_ns >= FL_LOAD_HOLD_NS)
        fl_load_set_level(l, target, now);
}

/* A closed window's signals, at time now: the level's step, apart from
 * the clocks (the probe measures them; tests give them). */
static inline void fl_load_window(fl_load* l, int64_t now, int busy_pct, int64_t lag_ns,
                                  int64_t wait_ns) {
    l->busy_pct = busy_pct;
    l->last_lag_ns = lag_ns;
    l->last_wait_ns = wait_ns;
    fl_load_settle(l, fl_load_target(l, now), now);
}

/* One probe: its lateness is the lag; a full window sets the level. */
static inline void fl_load_probe(fl_load* l) {
    int64_t now = fl_load_clock(CLOCK_MONOTONIC), cpu, span, busy;
    int64_t lag = now - l->due_ns;
    if (lag > l->window_lag_ns)
        l->window_lag_ns = lag;
    l->due_ns = now + FL_LOAD_PROBE_NS;
    span = now - l->window_start_ns;
    if (span < FL_LOAD_WINDOW_NS)
        return;
    cpu = fl_load_clock(CLOCK_THREAD_CPUTIME_ID);
    busy = (cpu - l->window_cpu_ns) * 100 / span;
    fl_load_window(l, now, busy > 100 ? 100 : (int)busy, l->window_lag_ns, l->window_wait_ns);
    l->window_start_ns = now;
    l->window_cpu_ns = cpu;
    l->window_lag_ns = l->window_wait_ns = 0;
}

/* The RESP front held n bytes of a connection back / took them up again
 * after they waited wait_ns. */
static inline void fl_load_hold(fl_load* l, int64_t n) {
    l->pending_bytes += n;
    l->pending_conns++;
    l->deferrals++;
}

static inline void fl_load_release(fl_load* l, int64_t n, int64_t wait_ns) {
    l->pending_bytes -= n;
    l->pending_conns--;
    if (wait_ns > l->window_wait_ns)
        l->window_wait_ns = wait_ns;
}

/* A shed check: counted by priority and outcome. */
static inline void fl_load_count_shed(fl_load* l, int priority, int allowed) {
    l->shed[priority][allowed ? 1 : 0]++;
}

#endif
