/*
 * The software switch's compiled data path.
 *
 * What it does: DATA datagrams, exactly as host/switch/model.py defines them (parse, job
 * and source lookup, the slot rules with 32-bit modular sequence numbers, exact int64
 * accumulation, saturation to int32 with OVERFLOW, RESULT formation, unicast re-sends of
 * stored results, bounded-mode deadlines in one heap ordered as the model's). Everything
 * else (CONTROL, STATUS_REQ, truncated or foreign datagrams) goes back to Python, where
 * the model handles it. The model stays the definition: tests/test_switch_engine.py
 * feeds both the same random traffic and compares every output datagram and counter.
 *
 * Why C and not numba: the batch loop makes system calls (ppoll, recvmmsg, sendmmsg) with
 * the GIL released, which numba cannot do without ctypes trampolines; and a C extension
 * has no JIT warm-up. The wire layout is not written here: Engine() takes the field
 * offsets from ina_fabric.protocol.fields (the one definition; ina_fabric/protocol/ina_wire.h).
 *
 * Refusals (issue 43): DATA dropped for a reason its sender can fix is answered with an
 * ERROR, the DATA's header with type ERROR, the reason (fields.Refusal) in ``count`` and
 * a figure in ``bitmap``, rate-limited per source bucket, as the model's _refuse.
 *
 * Two ways in:
 *   Engine.process(datagram, ip, port, now) -> [(ip, port, bytes)]   pure, for tests
 *   Engine.serve(fd, max_wait) -> [(bytes, ip, port)]                 the socket loop:
 *       waits (ppoll) until a datagram or the next deadline, receives a batch with
 *       recvmmsg, handles DATA, sends results with sendmmsg, fires deadlines; returns
 *       the datagrams that are not DATA (for the Python model) or after max_wait.
 *   Engine.set_gso(on): in serve mode, a run of RESULTs to one destination (a job's
 *       multicast group) goes as one send with UDP_SEGMENT (generic segmentation
 *       offload): the kernel cuts it into datagrams as late as it can, so the socket,
 *       the qdisc, a veth and a bridge are passed once per 64 KB, not once per datagram
 *       (docs/congestion.md, "Sending in runs"). Off by default; a kernel that
 *       refuses it turns it off by itself.
 *   Engine.set_pace(bps): in serve mode, the datagrams to any one destination go out no
 *       faster than bps (a worker's downlink rate): a deadline that closes many slots at
 *       once (bounded-skip) queues their RESULTs instead of putting a burst into a
 *       downlink queue that drops it (issue 18: 1,100 RESULTs dropped per host and
 *       run with the transformer). Written here because the queue points into the
 *       slots' stored results; no library paces sendmmsg per destination.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "ina_wire.h"
#include "../transport/ina_gso.h"

#define SEQ_HALF 0x80000000u
#define POOL_MARK_DIV 8          /* the model's: CONGESTED from 7/8 of the pool held */
#define MAX_MEMBERS 32
#define BATCH 16                 /* 16 x 64 KB still in L2 when they are summed */
#define RXBUF 65536
#define SENDQ 512
#define GSO_MAX_SEGS 64          /* a run (ina_gso.h): the kernel's UDP_MAX_SEGMENTS */
#define SCRATCH (8u << 20)
#define MAX_OTHERS BATCH   /* serve returns after the batch that had any */
#define PACE_DESTS 64      /* destinations paced separately (a worker's downlink each) */
#define PACE_BURST 0.002   /* seconds of credit a destination may send at once */
#define WIRE_EXTRA 46      /* bytes a datagram costs on the wire beyond its UDP payload */
#define ERROR_SOURCES 256  /* fields.ERROR_SOURCES: rate-limit buckets of ERROR replies */
/* the reasons of fields.Refusal */
enum { R_UNKNOWN_JOB = 1, R_NOT_MEMBER, R_BAD_LENGTH, R_BAD_SESSION, R_STALE, R_BAD_WIDTH };

/* the counters (C_<NAME>, COUNTER_NAMES): generated from ina_fabric/protocol/counters.py */
#include "ina_counters.h"

typedef InaLayout Layout;

typedef struct { uint32_t ip; uint16_t port; } Addr;   /* host byte order */

typedef struct {
    uint32_t tag, bitmap, result_len;
    uint16_t nelem;
    uint8_t complete, has_result, pending;
    uint8_t up;                  /* tree: closed here, sent to the parent, its RESULT
                                    awaited (result holds the DATA sent up) */
    uint8_t overflow;            /* tree: a child switch's DATA had OVERFLOW */
    uint8_t held;                /* pool: holds one of the engine's pool slots */
    uint8_t over;                /* pool: opened on a full pool, its DATA go to the parent */
    uint8_t via_set;             /* parent of a pool: sums a child's FORWARDED DATA */
    Addr via;                    /* (that child: the RESULT goes to it) */
    uint16_t count;              /* workers in the sum (a child switch's DATA: its count) */
    uint8_t wide;                /* acc holds int64 sums (else int32: see narrow below) */
    uint8_t width;               /* the width byte of the DATA that opened it (0: int32;
                                    any other: the generic int64 path, sum_narrow) */
    uint64_t order;              /* when it opened, in the engine's opening count */
    int64_t bound;               /* narrow: sum over contributions of their max |value| */
    int exponent;
    double opened_at;
    int64_t *acc;
    uint8_t *result;
} Slot;

typedef struct {
    int id, n, bounded, skip, ngroup, nopen;
    uint32_t absent;             /* bounded-skip: skipped workers (the model's absent) */
    double absent_since[MAX_MEMBERS];   /* when each became absent (the model's) */
    uint32_t window, elements;
    double deadline;
    uint64_t session;            /* the run's session id: DATA must carry it, RESULTs do */
    /* trees (docs/fabric.md): the parent (has_parent), this switch's member id there,
     * whether the members are child switches, the workers a full sum covers */
    int has_parent, index, children, total;
    Addr parent;
    uint32_t head;               /* the seq after the newest slot opened (its position) */
    double active;               /* install or last accepted DATA (ids held by sessions) */
    Addr members[MAX_MEMBERS];
    Addr group[MAX_MEMBERS];
    Slot *slots;                 /* 2W, index seq mod 2W */
    /* pool: each member has the RESULT of every seq below its acked (its DATA's count);
     * the stored results below freed went back to the pool (the model's _JobState) */
    uint32_t acked[MAX_MEMBERS];
    uint32_t freed;
    int64_t *accmem;
    uint8_t *resmem;
    uint64_t c[NCOUNTERS];       /* this job's share of the counters (JOB_COUNTERS) */
} Job;

/* a count made once a datagram's job is found: the switch's and the job's (the model's
 * _Tally) */
#define COUNT(e, j, x) ((e)->c[x]++, (j)->c[x]++)

typedef struct { double t; uint32_t job, seq; double opened_at; } Entry;

/* where outputs go: a Python list (process) or the sendmmsg queue (serve) */
typedef struct {
    PyObject *list;              /* pure mode when non-NULL */
    int fd, n;
    struct mmsghdr msgs[SENDQ];
    struct iovec iov[SENDQ];
    struct sockaddr_in addr[SENDQ];
    Slot *ref[SENDQ];
    uint8_t held[SENDQ];         /* pacing kept it in the queue at least once */
    uint8_t *scratch;
    size_t scratch_used;
    int failed;                  /* pure mode: a Python error is set */
    int gso;                     /* serve mode: runs to one destination go as GSO sends */
    struct mmsghdr gm[SENDQ];    /* sink_flush's sends: a run of datagrams each */
    int gfirst[SENDQ], gcount[SENDQ];
    GsoCtl gctl[SENDQ];
} Sink;

typedef struct {
    PyObject_HEAD
    Layout L;
    Job *jobs[65536];
    Entry *heap;
    size_t heap_n, heap_cap;
    uint64_t c[NCOUNTERS];
    Sink *sink;
    uint64_t opened;             /* slots opened so far: their order (oldest open slot) */
    struct mmsghdr *rmsgs;
    struct iovec *riov;
    struct sockaddr_in *raddr;
    uint8_t *rbuf;
    /* pacing (serve mode): datagrams to one destination go out no faster than
     * ``pace`` bit/s; the queue keeps the rest (``sink_drain``); 0: off */
    double pace, pace_wake;
    struct { uint32_t ip; uint16_t port; double next; } dests[PACE_DESTS];
    int ndests;
    /* refusals: answer them (the model's ``answers``), at most once per error_interval
     * per source bucket (fields.error_bucket) */
    int answers;
    double error_interval;
    double answered[ERROR_SOURCES];
    uint8_t answered_set[ERROR_SOURCES];
    /* the shared slot pool (the model's pool_slots; docs/pool.md): on when ``pool``,
     * ``pool_slots`` slots of the flat jobs, ``pool_used`` of them held; the overflow
     * goes to ``pool_parent`` */
    int pool;
    long pool_slots, pool_used;
    long pool_mark;              /* CONGESTED from here on: slots - slots / POOL_MARK_DIV */
    Addr pool_parent;
} Engine;

#define rd16 ina_rd16
#define rd32 ina_rd32
#define wr16 ina_wr16
#define wr32 ina_wr32

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);   /* the clock of Python's time.monotonic() */
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- deadline heap, ordered as the model's tuples (t, job, seq, opened_at) ---------- */
static inline int entry_lt(const Entry *a, const Entry *b) {
    if (a->t != b->t) return a->t < b->t;
    if (a->job != b->job) return a->job < b->job;
    if (a->seq != b->seq) return a->seq < b->seq;
    return a->opened_at < b->opened_at;
}

static int heap_push(Engine *e, Entry x) {
    if (e->heap_n == e->heap_cap) {
        size_t cap = e->heap_cap ? 2 * e->heap_cap : 1024;
        Entry *h = realloc(e->heap, cap * sizeof(Entry));
        if (!h) return -1;
        e->heap = h;
        e->heap_cap = cap;
    }
    size_t i = e->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!entry_lt(&x, &e->heap[p])) break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = x;
    return 0;
}

static Entry heap_pop(Engine *e) {
    Entry top = e->heap[0], x = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const Entry *best = &x;
        if (l < n && entry_lt(&e->heap[l], best)) { m = l; best = &e->heap[l]; }
        if (r < n && entry_lt(&e->heap[r], best)) { m = r; }
        if (m == i) break;
        e->heap[i] = e->heap[m];
        i = m;
    }
    if (n) e->heap[i] = x;
    return top;
}

static inline Slot *slot_of(Job *j, uint32_t seq) {
    return &j->slots[seq & (2 * j->window - 1)];
}

/* the model's _live: the entry's slot is still open, opened then, with that deadline */
static Slot *entry_live(Engine *e, const Entry *x) {
    Job *j = e->jobs[x->job];
    if (!j || !j->bounded) return NULL;
    Slot *s = slot_of(j, x->seq);
    if (s->complete || s->up || s->tag != x->seq) return NULL;
    if (s->opened_at != x->opened_at || x->opened_at + j->deadline != x->t) return NULL;
    return s;
}

/* ---- output ------------------------------------------------------------------------ */
/* Group the queue from ``from`` into sends: with k->gso, in runs to one destination
 * (ina_gso.h; a job's multicast group's RESULTs pass the bridge once per run). */
static int sink_group(Sink *k, int from) {
    int ng = 0;
    for (int i = from; i < k->n; ng++) {
        int n = k->gso ? gso_run(k->iov, k->addr, i, k->n, GSO_MAX_SEGS) : 1;
        struct msghdr *h = &k->gm[ng].msg_hdr;
        *h = k->msgs[i].msg_hdr;
        h->msg_iovlen = n;
        if (n > 1) gso_mark(h, &k->gctl[ng], k->iov[i].iov_len);
        k->gfirst[ng] = i;
        k->gcount[ng] = n;
        i += n;
    }
    return ng;
}

static void sink_flush(Engine *e, Sink *k) {
    int i = 0, ng = sink_group(k, 0);
    while (i < ng) {
        int r;
        Py_BEGIN_ALLOW_THREADS
        r = sendmmsg(k->fd, k->gm + i, ng - i, 0);
        Py_END_ALLOW_THREADS
        if (r < 0) {
            if (errno == EINTR) continue;
            if (gso_refused(errno) && k->gso && k->gcount[i] > 1) {
                k->gso = 0;              /* this kernel cannot segment: one per send */
                ng = sink_group(k, k->gfirst[i]);   /* the rest, each its own */
                i = 0;
                continue;
            }
            e->c[C_SEND_ERRORS] += k->gcount[i];   /* lost; go on with the next */
            i++;
        } else {
            i += r;
        }
    }
    if (k->n) e->c[C_TX_BATCHES]++;
    for (i = 0; i < k->n; i++)
        if (k->ref[i]) k->ref[i]->pending = 0;
    k->n = 0;
    k->scratch_used = 0;
}

/* the pacing state of one destination (the oldest entry makes room when all are used) */
static double *dest_next(Engine *e, uint32_t ip, uint16_t port) {
    int old = 0;
    for (int i = 0; i < e->ndests; i++) {
        if (e->dests[i].ip == ip && e->dests[i].port == port) return &e->dests[i].next;
        if (e->dests[i].next < e->dests[old].next) old = i;
    }
    int i = e->ndests < PACE_DESTS ? e->ndests++ : old;
    e->dests[i].ip = ip;
    e->dests[i].port = port;
    e->dests[i].next = 0.0;
    return &e->dests[i].next;
}

/* Serve mode, pacing on: send the queued datagrams whose destination's time has come, in
 * queue order (one destination's stay in order: once one waits, the later ones wait
 * too), keep the others at the front of the queue, and set ``pace_wake`` to when the
 * first of them falls due. Pacing off: ``sink_flush``. Any other flush (a full queue, a
 * slot reused while its result waits, a job change) sends everything at once. */
static void sink_drain(Engine *e, Sink *k, double now) {
    e->pace_wake = 0.0;
    if (e->pace <= 0.0 || k->list || !k->n) {
        sink_flush(e, k);
        return;
    }
    struct mmsghdr out[SENDQ];
    int due[SENDQ], nd = 0, nk = 0;
    double wake = 0.0;
    for (int i = 0; i < k->n; i++) {
        double *next = dest_next(e, ntohl(k->addr[i].sin_addr.s_addr),
                                 ntohs(k->addr[i].sin_port));
        double t = *next > now - PACE_BURST ? *next : now - PACE_BURST;
        if (t <= now) {
            *next = t + (double)(k->iov[i].iov_len + WIRE_EXTRA) * 8.0 / e->pace;
            due[nd++] = i;
        } else {
            if (!wake || t < wake) wake = t;
            if (!k->held[i]) {           /* counted once per datagram */
                e->c[C_PACE_HELD]++;
                k->held[i] = 1;
            }
        }
    }
    for (int j = 0; j < nd; j++) out[j] = k->msgs[due[j]];
    int i = 0;
    while (i < nd) {
        int r;
        Py_BEGIN_ALLOW_THREADS
        r = sendmmsg(k->fd, out + i, nd - i, 0);
        Py_END_ALLOW_THREADS
        if (r < 0) {
            if (errno == EINTR) continue;
            e->c[C_SEND_ERRORS]++;
            i++;
        } else {
            i += r;
        }
    }
    if (nd) e->c[C_TX_BATCHES]++;
    /* the sent ones release their slots; the kept ones move to the front, in order */
    int d = 0;
    for (int j = 0; j < k->n; j++) {
        if (d < nd && due[d] == j) {
            if (k->ref[j]) k->ref[j]->pending = 0;
            d++;
            continue;
        }
        if (nk != j) {
            k->msgs[nk] = k->msgs[j];
            k->iov[nk] = k->iov[j];
            k->addr[nk] = k->addr[j];
            k->ref[nk] = k->ref[j];
            k->held[nk] = k->held[j];
        }
        k->msgs[nk].msg_hdr.msg_name = &k->addr[nk];
        k->msgs[nk].msg_hdr.msg_iov = &k->iov[nk];
        nk++;
    }
    k->n = nk;
    if (!nk) k->scratch_used = 0;
    e->pace_wake = wake;
}

/* One datagram out: ``buf`` is a slot's stored result; ``worker`` >= 0 makes it the
 * unicast re-send to that worker (worker field set, RETRANSMIT flag). */
/* Entry ``i`` of the send queue: ``len`` bytes at ``data`` to ``to``. */
static inline void sink_entry(Sink *k, int i, Addr to, uint8_t *data, size_t len) {
    k->iov[i].iov_base = data;
    k->iov[i].iov_len = len;
    k->addr[i].sin_family = AF_INET;
    k->addr[i].sin_port = htons(to.port);
    k->addr[i].sin_addr.s_addr = htonl(to.ip);
    memset(&k->msgs[i].msg_hdr, 0, sizeof(struct msghdr));
    k->msgs[i].msg_hdr.msg_name = &k->addr[i];
    k->msgs[i].msg_hdr.msg_namelen = sizeof(struct sockaddr_in);
    k->msgs[i].msg_hdr.msg_iov = &k->iov[i];
    k->msgs[i].msg_hdr.msg_iovlen = 1;
}

static void sink_push(Engine *e, Sink *k, Addr to, Slot *s, int worker) {
    const Layout *L = &e->L;
    const uint8_t *buf = s->result;
    size_t len = s->result_len;
    if (k->list) {
        if (k->failed) return;
        PyObject *b = PyBytes_FromStringAndSize((const char *)buf, len);
        if (!b) { k->failed = 1; return; }
        if (worker >= 0) {
            uint8_t *p = (uint8_t *)PyBytes_AS_STRING(b);
            p[L->worker] = worker;
            p[L->flags] |= L->f_retransmit;
        }
        PyObject *t = Py_BuildValue("(kiN)", (unsigned long)to.ip, (int)to.port, b);
        if (!t || PyList_Append(k->list, t) < 0) k->failed = 1;
        Py_XDECREF(t);
        return;
    }
    if (k->n == SENDQ || (worker >= 0 && k->scratch_used + len > SCRATCH)) sink_flush(e, k);
    int i = k->n++;
    uint8_t *data = (uint8_t *)buf;
    k->ref[i] = NULL;
    k->held[i] = 0;
    if (worker >= 0) {
        data = k->scratch + k->scratch_used;
        k->scratch_used += (len + 7) & ~(size_t)7;
        memcpy(data, buf, len);
        data[L->worker] = worker;
        data[L->flags] |= L->f_retransmit;
    } else {
        s->pending = 1;          /* the queue points into the slot's stored result */
        k->ref[i] = s;
    }
    sink_entry(k, i, to, data, len);
}

/* One datagram out that no slot stores (a forwarded DATA, a relayed RESULT): copied
 * into the scratch area, with ``set`` flags set and ``clear`` flags cleared. */
static void sink_push_raw(Engine *e, Sink *k, Addr to, const uint8_t *buf, size_t len,
                          int set, int clear) {
    const Layout *L = &e->L;
    if (k->list) {
        if (k->failed) return;
        PyObject *b = PyBytes_FromStringAndSize((const char *)buf, len);
        if (!b) { k->failed = 1; return; }
        uint8_t *p = (uint8_t *)PyBytes_AS_STRING(b);
        p[L->flags] = (uint8_t)((p[L->flags] | set) & ~clear);
        PyObject *t = Py_BuildValue("(kiN)", (unsigned long)to.ip, (int)to.port, b);
        if (!t || PyList_Append(k->list, t) < 0) k->failed = 1;
        Py_XDECREF(t);
        return;
    }
    if (k->n == SENDQ || k->scratch_used + len > SCRATCH) sink_flush(e, k);
    int i = k->n++;
    uint8_t *data = k->scratch + k->scratch_used;
    k->scratch_used += (len + 7) & ~(size_t)7;
    memcpy(data, buf, len);
    data[L->flags] = (uint8_t)((data[L->flags] | set) & ~clear);
    k->ref[i] = NULL;
    k->held[i] = 0;
    sink_entry(k, i, to, data, len);
}

/* ---- the shared slot pool (the model's _release, _take, _confirmed) ----------------- */
static inline void pool_release(Engine *e, Slot *s) {
    if (s->held) {
        s->held = 0;
        e->pool_used--;
    }
}

static void pool_release_job(Engine *e, Job *j) {
    if (!j) return;
    for (size_t i = 0; i < 2 * (size_t)j->window; i++) pool_release(e, &j->slots[i]);
}

static inline int pool_take(Engine *e, Slot *s) {
    if (!e->pool) return 1;
    if (e->pool_used >= e->pool_slots) return 0;
    s->held = 1;
    e->pool_used++;
    return 1;
}

/* every member contributed ``seq``: the stored result of seq - W goes back to the pool */
static void pool_confirmed(Engine *e, Job *j, uint32_t seq) {
    if (!e->pool) return;
    uint32_t prev = seq - j->window;
    Slot *s = slot_of(j, prev);
    if (s->held && s->tag == prev && s->complete && !s->up) {
        s->has_result = 0;
        pool_release(e, s);
    }
}

/* the model's _ack: a member's DATA of seq says it has the RESULT of every seq up to
 * seq - d (d > 0); the slots below every member's ack give their pool slots back */
static void pool_ack(Engine *e, Job *j, uint32_t worker, uint32_t seq, uint32_t d) {
    uint32_t a = seq - d + 1, ahead = a - j->acked[worker];
    if (!(ahead > 0 && ahead < SEQ_HALF)) return;
    j->acked[worker] = a;
    uint32_t low = j->acked[0];
    for (int m = 1; m < j->n; m++) {
        uint32_t behind = low - j->acked[m];
        if (behind > 0 && behind < SEQ_HALF) low = j->acked[m];
    }
    uint32_t n = low - j->freed, w2 = 2 * j->window;
    if (!(n > 0 && n < SEQ_HALF)) return;
    uint32_t s = n <= w2 ? j->freed : low - w2;
    j->freed = low;
    for (; s != low; s++) {
        Slot *x = slot_of(j, s);
        if (x->held && x->tag == s && x->complete && !x->up) {
            x->has_result = 0;
            pool_release(e, x);
        }
    }
}

/* The model's _refuse: the ERROR answering DATA ``d`` from ``to`` (its header, type
 * ERROR, ``reason`` in count, ``figure`` in bitmap), unless the source's bucket was
 * answered within error_interval. */
static void refuse(Engine *e, Sink *k, Addr to, const uint8_t *d, int reason,
                   uint32_t figure, double now) {
    const Layout *L = &e->L;
    if (!e->answers) return;
    uint32_t b = ((to.ip ^ ((uint32_t)to.port << 16) ^ to.port) * 0x9E3779B1u) >> 24;
    if (e->answered_set[b] && now - e->answered[b] < e->error_interval) {
        e->c[C_ERRORS_LIMITED]++;
        return;
    }
    e->answered_set[b] = 1;
    e->answered[b] = now;
    e->c[C_ERRORS_SENT]++;
    uint8_t r[64];
    size_t len = (size_t)L->header;
    memcpy(r, d, len);
    r[L->type] = L->t_error;
    r[L->flags] = 0;
    r[L->exponent] = 0;
    ina_wr16(r + L->count, reason);
    wr16(r + L->nelem, 0);
    r[L->width] = 0;
    wr32(r + L->bitmap, figure);
    sink_push_raw(e, k, to, r, len, 0, 0);
}

/* the element loops, built for AVX2 and for any x86-64 (one is picked at load time).
 * Their indexes are size_t: with a uint32_t i, ``in + 4 * i`` may wrap as far as the
 * compiler knows, so it loaded each element on its own (vpextrd/vpinsrd: an emulated
 * gather) instead of 32 contiguous bytes; the sums ran at about a third of the speed. */
#define TARGETS __attribute__((target_clones("avx2", "default")))

TARGETS
static void accumulate(int64_t *restrict acc, const uint8_t *restrict in, uint32_t nelem) {
    for (size_t i = 0; i < nelem; i++) acc[i] += ina_be32(in + 4 * i);
}

/* Narrow sums. A slot sums in int32 while the sum of its contributions' largest
 * magnitudes stays below 2^31 (then no partial sum can leave the int32 range, so int32
 * arithmetic is exact and nothing saturates); the first contribution that would break
 * that bound widens the slot to int64 (converted in place) before it is added. Agreed
 * exponents keep every sum narrow (quantize.py: N * 2^S <= 2^30); only values from
 * outside the protocol make a slot wide. Half the memory traffic of int64 sums. */
static inline uint32_t mag(int32_t v) { return v < 0 ? 0u - (uint32_t)v : (uint32_t)v; }

/* the first contribution (stored) or a later one (added, wrapping: undone by sub32 if
 * the bound says the sum could leave int32); returns its largest magnitude */
static inline __attribute__((always_inline)) uint32_t
take32(int32_t *restrict acc, const uint8_t *restrict in, uint32_t n, int first) {
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t v = ina_be32(in + 4 * i);
        acc[i] = first ? v : (int32_t)((uint32_t)acc[i] + (uint32_t)v);
        uint32_t a = mag(v);
        m = a > m ? a : m;
    }
    return m;
}

TARGETS
static uint32_t load32(int32_t *restrict acc, const uint8_t *restrict in, uint32_t n) {
    return take32(acc, in, n, 1);
}

TARGETS
static uint32_t add32(int32_t *restrict acc, const uint8_t *restrict in, uint32_t n) {
    return take32(acc, in, n, 0);
}

TARGETS
static void sub32(int32_t *restrict acc, const uint8_t *restrict in, uint32_t n) {
    for (size_t i = 0; i < n; i++) {
        int32_t v = ina_be32(in + 4 * i);
        acc[i] = (int32_t)((uint32_t)acc[i] - (uint32_t)v);
    }
}

/* the last contribution added and the sum stored big-endian (acc is not written) */
TARGETS
static uint32_t add32_out(const int32_t *restrict acc, const uint8_t *restrict in,
                          uint32_t *restrict dst, uint32_t n) {
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t v = ina_be32(in + 4 * i);
        uint32_t a = mag(v);
        m = a > m ? a : m;
        dst[i] = __builtin_bswap32((uint32_t)acc[i] + (uint32_t)v);
    }
    return m;
}

TARGETS
static void store32(const int32_t *restrict acc, uint32_t *restrict dst, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) dst[i] = __builtin_bswap32((uint32_t)acc[i]);
}

/* int32 sums to int64 in place: backwards, each int64 lands on int32s already read */
static void widen(Slot *s) {
    int32_t *a32 = (int32_t *)s->acc;
    for (uint32_t i = s->nelem; i-- > 0;) s->acc[i] = a32[i];
    s->wide = 1;
}

/* int64 sums (plus the last contribution ``in``, when ``add``) saturated to int32 and
 * stored big-endian; returns whether any element saturated */
static inline __attribute__((always_inline)) int
sat_out(const int64_t *restrict acc, const uint8_t *restrict in, uint32_t *restrict dst,
        uint32_t n, int add) {
    int clipped = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t v = acc[i] + (add ? ina_be32(in + 4 * i) : 0);
        int64_t c = v > INT32_MAX ? INT32_MAX : (v < INT32_MIN ? INT32_MIN : v);
        clipped |= c != v;
        dst[i] = __builtin_bswap32((uint32_t)(int32_t)c);
    }
    return clipped;
}

/* the last contribution added and the sum saturated in one pass (acc is not written) */
TARGETS
static int add_saturate(const int64_t *restrict acc, const uint8_t *restrict in,
                        uint32_t *restrict dst, uint32_t nelem) {
    return sat_out(acc, in, dst, nelem, 1);
}

TARGETS
static int saturate(const int64_t *restrict acc, uint32_t *restrict dst, uint32_t nelem) {
    return sat_out(acc, NULL, dst, nelem, 0);
}

/* Element widths (issue 40, docs/precision.md): the width byte's low nibble is the code
 * of the elements after the header (0 int32, 1 int16, 2 int8: 4 >> code bytes), its high
 * nibble the RESULT's. fields.valid_width, fields.up_width. */
static inline int width_ok(uint8_t w) {
    int lo = w & 15, hi = w >> 4;
    return lo <= 2 && hi <= 2 && lo <= hi;
}

/* the code a partial sum of result code ``hi`` goes up with (exact; fields.up_width) */
static inline int up_code(int hi, int total) { return hi == 2 && total <= 255 ? 1 : 0; }

/* one element of code ``code`` at index i (big-endian) */
static inline int64_t elem_at(const uint8_t *in, int code, uint32_t i) {
    if (code == 0) return ina_be32(in + 4 * i);
    if (code == 1) return (int16_t)(((uint16_t)in[2 * i] << 8) | in[2 * i + 1]);
    return (int8_t)in[i];
}

/* a slot of another width than int32/int32 sums in int64 (no narrow-int32 trick) */
static void sum_narrow(Slot *s, const uint8_t *in, int first) {
    int code = s->width & 15;
    s->wide = 1;
    if (first)
        for (uint32_t i = 0; i < s->nelem; i++) s->acc[i] = elem_at(in, code, i);
    else
        for (uint32_t i = 0; i < s->nelem; i++) s->acc[i] += elem_at(in, code, i);
}

/* int64 sums saturated to code ``code`` and stored big-endian at dst; whether any
 * element saturated */
static int saturate_to(const int64_t *acc, uint8_t *dst, uint32_t n, int code) {
    int bits = 32 >> code, clipped = 0;
    int64_t hi = ((int64_t)1 << (bits - 1)) - 1, lo = -hi - 1;
    for (uint32_t i = 0; i < n; i++) {
        int64_t v = acc[i], c = v > hi ? hi : (v < lo ? lo : v);
        clipped |= c != v;
        if (code == 0) ina_put_be32(dst + 4 * i, (uint32_t)(int32_t)c);
        else if (code == 1) { dst[2 * i] = (uint8_t)(c >> 8); dst[2 * i + 1] = (uint8_t)c; }
        else dst[i] = (uint8_t)c;
    }
    return clipped;
}

/* the model's _close: its _emit at the root (saturate, flag, store the RESULT, send it
 * to the group), its _send_up at a switch with a parent (the same sum, as one DATA to the
 * parent, kept for re-sends). ``in``: the completing packet's elements, not yet in acc
 * (NULL: all are in acc); ``first``: and no other contribution came (a one-member slot:
 * the sum is the packet itself). */
static void emit(Engine *e, Sink *k, Job *j, Slot *s, const uint8_t *in, int first) {
    const Layout *L = &e->L;
    if (s->pending) sink_flush(e, k);    /* the old result is still queued: send it first */
    uint8_t *r = s->result;
    int flags = s->overflow ? L->f_overflow : 0;
    if (s->count < j->total) {
        flags |= L->f_partial;
        COUNT(e, j, C_PARTIALS);
    }
    int clipped = 0;
    /* the slot's result buffer: 64-aligned, the header a multiple of 4 bytes */
    uint32_t *dst = (uint32_t *)(r + L->header);
    int hi = s->width >> 4, out = j->has_parent ? up_code(hi, j->total) : hi;
    if (s->width) {                      /* another width: all of it is in acc */
        clipped = saturate_to(s->acc, (uint8_t *)dst, s->nelem, out);
    } else if (in && first) {
        memcpy(dst, in, 4 * (size_t)s->nelem);
    } else if (in) {
        if (!s->wide && s->bound + add32_out((int32_t *)s->acc, in, dst, s->nelem) >
                INT32_MAX)
            widen(s);                        /* what add32_out wrote is rewritten below */
        if (s->wide) clipped = add_saturate(s->acc, in, dst, s->nelem);
    } else if (!s->wide) {
        store32((int32_t *)s->acc, dst, s->nelem);
    } else {
        clipped = saturate(s->acc, dst, s->nelem);
    }
    if (clipped) {
        flags |= L->f_overflow;
        COUNT(e, j, C_OVERFLOWS);
    }
    if (!j->has_parent && e->pool && e->pool_used >= e->pool_mark) {  /* _pool_full */
        flags |= L->f_congested;
        COUNT(e, j, C_CONGESTED);
    }
    memset(r, 0, L->header);
    r[L->version] = L->v_version;
    r[L->type] = j->has_parent ? L->t_data : L->t_result;
    r[L->flags] = flags;
    r[L->exponent] = (uint8_t)(int8_t)s->exponent;
    wr16(r + L->job, j->id);
    r[L->worker] = j->has_parent ? j->index : L->group_worker;
    ina_wr16(r + L->count, s->count);
    wr32(r + L->seq, s->tag);
    wr16(r + L->nelem, s->nelem);
    wr32(r + L->bitmap, s->bitmap);
    ina_wr64(r + L->session, j->session);
    r[L->width] = s->width ? (uint8_t)(out | hi << 4) : 0;
    s->result_len = L->header + (4 >> out) * s->nelem;
    if (j->has_parent) {                 /* up: the slot waits for the parent's RESULT */
        s->up = 1;
        COUNT(e, j, C_UP);
        sink_push(e, k, j->parent, s, -1);
        return;
    }
    s->complete = 1;
    s->has_result = 1;
    COUNT(e, j, C_RESULTS);
    if (s->via_set) {                    /* a child's overflow: back to that child */
        sink_push(e, k, s->via, s, -1);
        return;
    }
    for (int g = 0; g < j->ngroup; g++) sink_push(e, k, j->group[g], s, -1);
}

/* a RESULT from the job's parent (the model's _from_parent): stored in the slot that
 * awaits it, with worker, RETRANSMIT and bitmap rewritten for this level, and relayed to
 * the group. The caller checked the job (installed, with a parent). */
static void process_result(Engine *e, Sink *k, Job *j, const uint8_t *d, size_t n,
                           Addr src, double now) {
    const Layout *L = &e->L;
    Addr parent = j->has_parent ? j->parent : e->pool_parent;
    if (src.ip != parent.ip || src.port != parent.port) {
        COUNT(e, j, C_DROP_UNKNOWN_SOURCE);
        return;
    }
    if (ina_rd64(d + L->session) != j->session) { COUNT(e, j, C_DROP_BAD_SESSION); return; }
    uint32_t seq = rd32(d + L->seq);
    Slot *s = slot_of(j, seq);
    if (s->over && s->tag == seq) {      /* the parent summed it (pool): relayed, unstored */
        int worker = d[L->worker];
        if (worker != L->group_worker && worker >= j->n) {
            COUNT(e, j, C_DROP_MALFORMED);
            return;
        }
        j->active = now;
        COUNT(e, j, C_RELAYED);
        int cong = 0;
        if (e->pool && e->pool_used >= e->pool_mark) {     /* _pool_full */
            cong = L->f_congested;
            COUNT(e, j, C_CONGESTED);
        }
        if (worker != L->group_worker) {
            sink_push_raw(e, k, j->members[worker], d, n, cong, 0);
            return;
        }
        for (int g = 0; g < j->ngroup; g++)
            sink_push_raw(e, k, j->group[g], d, n, cong, L->f_retransmit);
        return;
    }
    if (!s->up || s->tag != seq) { COUNT(e, j, C_DROP_RESULT); return; }
    if (rd16(d + L->nelem) != s->nelem || (int)rd16(d + L->count) > L->max_job_workers ||
            d[L->width] != (uint8_t)((s->width >> 4) | (s->width & 0xF0))) {
        COUNT(e, j, C_DROP_MALFORMED);
        return;
    }
    if (s->pending) sink_flush(e, k);    /* the DATA up is still queued: send it first */
    uint8_t *r = s->result;
    uint32_t mine = (rd32(d + L->bitmap) >> j->index) & 1u;
    memcpy(r, d, n);
    r[L->worker] = L->group_worker;
    r[L->flags] &= (uint8_t)~L->f_retransmit;
    wr32(r + L->bitmap, mine ? s->bitmap : 0);
    s->result_len = n;
    s->up = 0;
    s->complete = 1;
    s->has_result = 1;
    j->active = now;
    COUNT(e, j, C_RELAYED);
    for (int g = 0; g < j->ngroup; g++) sink_push(e, k, j->group[g], s, -1);
}

static inline uint32_t full_mask(const Job *j) {
    return j->n >= 32 ? 0xFFFFFFFFu : (1u << j->n) - 1;
}

/* the model's _back_in_time: DATA of an absent worker for a slot closed here is waited
 * for again only when it came before that slot's deadline, a deadline after it became
 * absent (the hold-off) */
static inline void back_in_time(Job *j, const Slot *s, uint32_t worker, double now) {
    uint32_t bit = 1u << worker;
    if ((j->absent & bit) && now < s->opened_at + j->deadline &&
            now >= j->absent_since[worker] + j->deadline)
        j->absent &= ~bit;
}

/* the model's _skip: the workers missing from ``bitmap`` are absent; every open slot of
 * the job with all the other workers' contributions closes now, in opening order */
static void skip_absent(Engine *e, Sink *k, Job *j, uint32_t bitmap, double now) {
    uint32_t full = full_mask(j), w2 = 2 * j->window;
    uint32_t fresh = full & ~bitmap & ~j->absent;
    for (int w = 0; w < j->n; w++)
        if (fresh >> w & 1u) j->absent_since[w] = now;
    j->absent |= fresh;
    for (;;) {                           /* the oldest qualifying open slot, one by one */
        Slot *best = NULL;
        for (uint32_t i = 0; i < w2; i++) {
            Slot *s = &j->slots[i];
            if (!s->complete && !s->up && (s->bitmap | j->absent) == full &&
                    (!best || s->order < best->order))
                best = s;
        }
        if (!best) return;
        COUNT(e, j, C_SKIPPED);
        j->nopen--;
        emit(e, k, j, best, NULL, 0);
    }
}

static void tick(Engine *e, Sink *k, double now) {
    while (e->heap_n && e->heap[0].t <= now) {
        Entry x = heap_pop(e);
        Slot *s = entry_live(e, &x);
        if (s) {
            Job *j = e->jobs[x.job];
            j->nopen--;
            emit(e, k, j, s, NULL, 0);
            if (j->skip && s->bitmap != full_mask(j)) skip_absent(e, k, j, s->bitmap, now);
        }
    }
}

static int next_deadline(Engine *e, double *t) {
    while (e->heap_n && !entry_live(e, &e->heap[0])) heap_pop(e);
    if (!e->heap_n) return 0;
    *t = e->heap[0].t;
    return 1;
}

/* The model's process() for a datagram that is DATA of our version, without the tick
 * (the caller ticks first). Returns -1 only when the heap cannot grow. */
static int process_data(Engine *e, Sink *k, const uint8_t *d, size_t n, Addr src,
                        double now) {
    const Layout *L = &e->L;
    uint64_t *c = e->c;
    c[C_RX]++;
    uint32_t nelem = rd16(d + L->nelem);
    uint8_t width = d[L->width];
    if (!width_ok(width)) { c[C_DROP_MALFORMED]++; return 0; }
    size_t body = n - L->header, eb = 4 >> (width & 15);
    if (body < eb * nelem) { c[C_DROP_TRUNCATED]++; return 0; }
    if (body != eb * nelem) { c[C_DROP_MALFORMED]++; return 0; }
    Job *j = e->jobs[rd16(d + L->job)];
    if (!j) {
        c[C_DROP_UNKNOWN_JOB]++;
        refuse(e, k, src, d, R_UNKNOWN_JOB, 0, now);
        return 0;
    }
    if (ina_rd64(d + L->session) != j->session) {
        COUNT(e, j, C_DROP_BAD_SESSION);
        refuse(e, k, src, d, R_BAD_SESSION, 0, now);
        return 0;
    }
    uint32_t worker = d[L->worker];
    /* a child switch's pool overflow: from that switch (the session is the capability) */
    int fwd = (d[L->flags] & L->f_forwarded) && !j->has_parent && !j->children;
    if ((int)worker >= j->n || (!fwd && (j->members[worker].ip != src.ip ||
            j->members[worker].port != src.port))) {
        COUNT(e, j, C_DROP_UNKNOWN_SOURCE);
        refuse(e, k, src, d, R_NOT_MEMBER, (uint32_t)j->n, now);
        return 0;
    }
    if (nelem > j->elements) {
        COUNT(e, j, C_DROP_MALFORMED);
        refuse(e, k, src, d, R_BAD_LENGTH, j->elements, now);
        return 0;
    }
    /* the workers this DATA covers: one for a worker, the count of a child switch */
    int covers = j->children ? (int)rd16(d + L->count) : 1;
    if (covers < 1 || covers > j->total) { COUNT(e, j, C_DROP_MALFORMED); return 0; }
    {   /* a worker's nibbles agree; a child's elements are up_code wide */
        int hi = width >> 4, lo = j->children ? up_code(hi, j->total) : hi;
        if (width != (uint8_t)(lo | hi << 4)) { COUNT(e, j, C_DROP_MALFORMED); return 0; }
    }
    COUNT(e, j, C_RX_DATA);
    if (fwd) COUNT(e, j, C_OVERFLOW_IN);
    uint32_t seq = rd32(d + L->seq), w2 = 2 * j->window;
    if (e->pool && !(fwd || j->has_parent || j->children) && rd16(d + L->count))
        pool_ack(e, j, worker, seq, rd16(d + L->count));
    Slot *s = slot_of(j, seq);
    uint32_t bit = 1u << worker;
    uint32_t ahead = seq - s->tag;
    if (s->complete && (ahead == w2 || (fwd && ahead > 0 && ahead < SEQ_HALF))) {
        pool_release(e, s);
        s->over = 0;
        if (!(fwd || j->has_parent || j->children || pool_take(e, s))) {
            /* the pool is full: this seq is summed by the parent */
            s->tag = seq;
            s->has_result = 0;
            s->up = 0;
            s->nelem = nelem;
            s->bitmap = 0;
            s->count = 0;
            s->over = 1;
            if (seq + 1 - j->head < SEQ_HALF) j->head = seq + 1;
            j->active = now;
            COUNT(e, j, C_OVERFLOW);
            sink_push_raw(e, k, e->pool_parent, d, n, L->f_forwarded, 0);
            return 0;
        }
        s->via_set = fwd;
        s->via = src;
        s->tag = seq;
        s->complete = 0;
        s->has_result = 0;
        s->nelem = nelem;                    /* acc is written by the first contribution */
        s->bitmap = 0;
        s->count = 0;
        s->exponent = L->no_exponent;
        s->up = 0;
        s->overflow = 0;
        s->width = width;
        s->opened_at = now;
        s->order = ++e->opened;
        j->nopen++;
        if (seq + 1 - j->head < SEQ_HALF) j->head = seq + 1;
        if (j->bounded) {
            Entry x = {now + j->deadline, (uint32_t)j->id, seq, now};
            if (heap_push(e, x) < 0) return -1;
        }
    } else if (seq != s->tag) {
        uint32_t behind = s->tag - seq;
        int stale = behind > 0 && behind < SEQ_HALF;
        COUNT(e, j, stale ? C_DROP_STALE : C_DROP_OUT_OF_WINDOW);
        if (stale) refuse(e, k, src, d, R_STALE, j->head, now);
        return 0;
    }
    if (s->over) {                       /* summed by the parent: goes there too */
        if (fwd) { COUNT(e, j, C_DROP_UNKNOWN_SOURCE); return 0; }
        j->active = now;
        COUNT(e, j, C_OVERFLOW);
        sink_push_raw(e, k, e->pool_parent, d, n, L->f_forwarded, 0);
        return 0;
    }
    if (s->complete) {
        if (!s->has_result) {                /* before the job began */
            COUNT(e, j, C_DROP_STALE);
            refuse(e, k, src, d, R_STALE, j->head, now);
            return 0;
        }
        back_in_time(j, s, worker, now);
        COUNT(e, j, (s->bitmap & bit) ? C_DUPLICATES : C_LATE);
        COUNT(e, j, C_RESENT);
        sink_push(e, k, fwd ? src : j->members[worker], s, (int)worker);
        return 0;
    }
    if (s->up) {                         /* closed here, the parent's RESULT awaited */
        back_in_time(j, s, worker, now);
        if (s->bitmap & bit) {
            COUNT(e, j, C_DUPLICATES);
            COUNT(e, j, C_UP_RESENT);
            sink_push(e, k, j->parent, s, j->index);    /* the DATA up, RETRANSMIT */
        } else {
            COUNT(e, j, C_LATE);
        }
        return 0;
    }
    if (s->bitmap & bit) { COUNT(e, j, C_DUPLICATES); return 0; }
    if (nelem != s->nelem) {
        COUNT(e, j, C_DROP_MALFORMED);
        refuse(e, k, src, d, R_BAD_LENGTH, s->nelem, now);
        return 0;
    }
    if (width != s->width) {
        COUNT(e, j, C_DROP_BAD_WIDTH);
        refuse(e, k, src, d, R_BAD_WIDTH, s->width, now);
        return 0;
    }
    COUNT(e, j, C_ACCEPTED);
    j->active = now;
    j->absent &= ~bit;                   /* in step again: slots wait for it again */
    s->bitmap |= bit;
    int ex = (int8_t)d[L->exponent];
    if (ex > s->exponent) s->exponent = ex;
    if (j->children && (d[L->flags] & L->f_overflow)) s->overflow = 1;
    const uint8_t *in = d + L->header;
    int first = s->bitmap == bit;
    if (width) {                         /* another width: the generic int64 path */
        sum_narrow(s, in, first);
        in = NULL;
        first = 0;
    }
    if ((s->bitmap | j->absent) == full_mask(j)) {
        /* the last one (bounded-skip: the last one not skipped): add, saturate, send */
        if (s->bitmap != full_mask(j)) COUNT(e, j, C_SKIPPED);
        else pool_confirmed(e, j, seq);
        s->count += covers;
        j->nopen--;
        emit(e, k, j, s, in, first);
    } else {
        if (!in) {
            /* summed above (another width) */
        } else if (first) {                  /* the first one: no zeroing pass */
            s->wide = 0;
            s->bound = load32((int32_t *)s->acc, in, nelem);
        } else if (s->wide) {
            accumulate(s->acc, in, nelem);
        } else {
            int32_t *a32 = (int32_t *)s->acc;
            int64_t b = s->bound + add32(a32, in, nelem);
            if (b > INT32_MAX) {             /* could leave int32: undo, widen, add */
                sub32(a32, in, nelem);
                widen(s);
                accumulate(s->acc, in, nelem);
            } else {
                s->bound = b;
            }
        }
        s->count += covers;
    }
    return 0;
}

static inline int is_data(const Engine *e, const uint8_t *d, size_t n) {
    return n >= (size_t)e->L.header && d[e->L.version] == e->L.v_version &&
           d[e->L.type] == e->L.t_data;
}

/* a RESULT of this version for a job with a parent (a tree's RESULT coming down): the
 * engine takes it; any other RESULT is the model's (drop_malformed) */
static inline Job *result_job(const Engine *e, const uint8_t *d, size_t n) {
    if (n < (size_t)e->L.header || d[e->L.version] != e->L.v_version ||
            d[e->L.type] != e->L.t_result)
        return NULL;
    Job *j = e->jobs[rd16(d + e->L.job)];
    return j && (j->has_parent || (e->pool && !j->children)) ? j : NULL;
}

/* the model's checks of a RESULT before _from_parent, then it; 0 or -1 as process_data */
static int process_down(Engine *e, Sink *k, Job *j, const uint8_t *d, size_t n, Addr src,
                        double now) {
    const Layout *L = &e->L;
    e->c[C_RX]++;
    uint32_t nelem = rd16(d + L->nelem);
    uint8_t width = d[L->width];
    if (!width_ok(width)) { e->c[C_DROP_MALFORMED]++; return 0; }
    size_t body = n - L->header, eb = 4 >> (width & 15);
    if (body < eb * nelem) { e->c[C_DROP_TRUNCATED]++; return 0; }
    if (body != eb * nelem) { e->c[C_DROP_MALFORMED]++; return 0; }
    process_result(e, k, j, d, n, src, now);
    return 0;
}

/* ---- Python type --------------------------------------------------------------------- */
static void job_free(Job *j) {
    if (!j) return;
    free(j->slots);
    free(j->accmem);
    free(j->resmem);
    free(j);
}

static void Engine_dealloc(Engine *e) {
    for (int i = 0; i < 65536; i++) job_free(e->jobs[i]);
    free(e->heap);
    if (e->sink) free(e->sink->scratch);
    free(e->sink);
    free(e->rmsgs);
    free(e->riov);
    free(e->raddr);
    free(e->rbuf);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

/* Engine(layout): layout is a dict of field offsets ("<name>") and widths in bytes
 * ("<name>_bytes") from protocol.fields, plus the constants the data path needs. */
static int Engine_init(Engine *e, PyObject *args, PyObject *kw) {
    PyObject *d;
    e->answers = 1;
    e->error_interval = 0.1;
    if (!PyArg_ParseTuple(args, "O!|pd", &PyDict_Type, &d, &e->answers, &e->error_interval))
        return -1;
    if (ina_layout_from_dict(d, &e->L) < 0) return -1;
    e->sink = calloc(1, sizeof(Sink));
    e->rmsgs = calloc(BATCH, sizeof(struct mmsghdr));
    e->riov = calloc(BATCH, sizeof(struct iovec));
    e->raddr = calloc(BATCH, sizeof(struct sockaddr_in));
    e->rbuf = aligned_alloc(64, (size_t)BATCH * RXBUF);
    if (!e->sink || !e->rmsgs || !e->riov || !e->raddr || !e->rbuf ||
            !(e->sink->scratch = aligned_alloc(64, SCRATCH))) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static int parse_addrs(PyObject *seq, Addr *out, int *n, const char *what) {
    PyObject *fast = PySequence_Fast(seq, what);
    if (!fast) return -1;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(fast);
    if (m < 0 || m > MAX_MEMBERS) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "%s: %zd addresses, at most %d", what, m, MAX_MEMBERS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        unsigned long ip;
        int port;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "ki", &ip, &port)) {
            Py_DECREF(fast);
            return -1;
        }
        out[i].ip = (uint32_t)ip;
        out[i].port = (uint16_t)port;
    }
    *n = (int)m;
    Py_DECREF(fast);
    return 0;
}

/* add_job(id, members, window, elements, mode, deadline, group, session, now
 *         [, parent, index, children, total]): install afresh; mode: 0 reliable,
 * 1 bounded, 2 bounded-skip (jobtable.MODES); parent: (ip, port) or None (the root);
 * index: the member id at the parent; children: the members are switches; total: the
 * workers a full sum covers (0: one per member) */
static PyObject *Engine_add_job(Engine *e, PyObject *args) {
    int id, mode, n, ngroup, index = 0, children = 0, total = 0;
    unsigned int window, elements;
    unsigned long long session;
    double deadline, now;
    PyObject *members, *group, *parent = Py_None;
    if (!PyArg_ParseTuple(args, "iOIIidOKd|Oipi", &id, &members, &window, &elements, &mode,
                          &deadline, &group, &session, &now, &parent, &index, &children,
                          &total))
        return NULL;
    unsigned long pip = 0;
    int pport = 0;
    if (parent != Py_None && !PyArg_ParseTuple(parent, "ki", &pip, &pport)) return NULL;
    if (index < 0 || index >= MAX_MEMBERS || total < 0 || total > e->L.max_job_workers) {
        PyErr_SetString(PyExc_ValueError, "index or total out of range");
        return NULL;
    }
    if (mode < 0 || mode > 2) {
        PyErr_SetString(PyExc_ValueError, "mode not in 0..2 (reliable, bounded, "
                        "bounded-skip)");
        return NULL;
    }
    if (id < 0 || id > 65535 || window == 0 || (window & (window - 1)) || elements == 0 ||
            elements > 65535) {
        PyErr_SetString(PyExc_ValueError, "job id, window (a power of two) or elements "
                        "out of range");
        return NULL;
    }
    Job *j = calloc(1, sizeof(Job));
    if (!j) return PyErr_NoMemory();
    if (parse_addrs(members, j->members, &n, "members") < 0 ||
            parse_addrs(group, j->group, &ngroup, "group") < 0) {
        job_free(j);
        return NULL;
    }
    j->id = id; j->n = n; j->ngroup = ngroup; j->bounded = mode >= 1; j->skip = mode == 2;
    j->window = window; j->elements = elements; j->deadline = deadline;
    j->session = session; j->active = now;
    j->has_parent = parent != Py_None;
    j->parent.ip = (uint32_t)pip;
    j->parent.port = (uint16_t)pport;
    j->index = index;
    j->children = children;
    j->total = total ? total : n;
    size_t w2 = 2 * (size_t)window, rlen = ((size_t)e->L.header + 4 * elements + 63) & ~63u;
    j->slots = calloc(w2, sizeof(Slot));
    j->accmem = malloc(w2 * elements * sizeof(int64_t));
    j->resmem = aligned_alloc(64, w2 * rlen);
    if (!j->slots || !j->accmem || !j->resmem) {
        job_free(j);
        return PyErr_NoMemory();
    }
    for (size_t k = 0; k < w2; k++) {
        Slot *s = &j->slots[k];
        s->tag = (uint32_t)(k - w2);     /* virtual, complete seq k - 2W (mod 2^32) */
        s->complete = 1;
        s->exponent = e->L.no_exponent;
        s->acc = j->accmem + k * elements;
        s->result = j->resmem + k * rlen;
    }
    if (e->sink->n) sink_flush(e, e->sink);   /* nothing queued may point at the old job */
    pool_release_job(e, e->jobs[id]);
    job_free(e->jobs[id]);
    e->jobs[id] = j;
    Py_RETURN_NONE;
}

static PyObject *Engine_remove_job(Engine *e, PyObject *args) {
    int id;
    if (!PyArg_ParseTuple(args, "i", &id)) return NULL;
    if (id >= 0 && id < 65536 && e->jobs[id]) {
        if (e->sink->n) sink_flush(e, e->sink);
        pool_release_job(e, e->jobs[id]);
        job_free(e->jobs[id]);
        e->jobs[id] = NULL;
    }
    Py_RETURN_NONE;
}

/* retune(id, mode, deadline): the model's _retune (open slots keep their data) */
static PyObject *Engine_retune(Engine *e, PyObject *args) {
    int id, mode;
    double deadline;
    if (!PyArg_ParseTuple(args, "iid", &id, &mode, &deadline)) return NULL;
    Job *j = (id >= 0 && id < 65536) ? e->jobs[id] : NULL;
    if (!j) return PyErr_Format(PyExc_KeyError, "job %d is not installed", id);
    if (mode < 0 || mode > 2) {
        PyErr_SetString(PyExc_ValueError, "mode not in 0..2");
        return NULL;
    }
    j->bounded = mode >= 1;
    j->skip = mode == 2;
    if (!j->skip) j->absent = 0;
    j->deadline = deadline;
    if (j->bounded) {
        for (size_t k = 0; k < 2 * (size_t)j->window; k++) {
            Slot *s = &j->slots[k];
            if (s->complete || s->up) continue;
            Entry x = {s->opened_at + deadline, (uint32_t)id, s->tag, s->opened_at};
            if (heap_push(e, x) < 0) return PyErr_NoMemory();
        }
    }
    Py_RETURN_NONE;
}

/* the accessors' one argument, a job id: its job, or NULL where none is installed;
 * -1 with an exception when the argument is not an int */
static int job_arg(Engine *e, PyObject *args, Job **j) {
    int id;
    if (!PyArg_ParseTuple(args, "i", &id)) return -1;
    *j = (id >= 0 && id < 65536) ? e->jobs[id] : NULL;
    return 0;
}

static PyObject *Engine_absent(Engine *e, PyObject *args) {
    int id;
    if (!PyArg_ParseTuple(args, "i", &id)) return NULL;
    Job *j = (id >= 0 && id < 65536) ? e->jobs[id] : NULL;
    if (!j) return PyErr_Format(PyExc_KeyError, "job %d is not installed", id);
    return PyLong_FromUnsignedLong(j->absent);
}

/* start_at(id, seq): the model's start_at (records as if seq packets had run) */
static PyObject *Engine_start_at(Engine *e, PyObject *args) {
    int id;
    unsigned long seq;
    if (!PyArg_ParseTuple(args, "ik", &id, &seq)) return NULL;
    Job *j = (id >= 0 && id < 65536) ? e->jobs[id] : NULL;
    if (!j) return PyErr_Format(PyExc_KeyError, "job %d is not installed", id);
    if (e->sink->n) sink_flush(e, e->sink);
    uint32_t w2 = 2 * j->window;
    for (uint32_t k = 0; k < w2; k++) {
        Slot *s = &j->slots[k];
        s->tag = (uint32_t)seq - w2 + ((k - (uint32_t)seq) & (w2 - 1));
        pool_release(e, s);
        s->over = 0;
        s->via_set = 0;
        s->complete = 1;
        s->has_result = 0;
        s->up = 0;
        s->bitmap = 0;
        s->count = 0;
        s->nelem = 0;
        s->width = 0;
        s->exponent = e->L.no_exponent;
    }
    j->nopen = 0;
    j->head = (uint32_t)seq;
    for (int m = 0; m < MAX_MEMBERS; m++) j->acked[m] = (uint32_t)seq;
    j->freed = (uint32_t)seq;
    Py_RETURN_NONE;
}

/* position(id): the job's head (the seq after the newest slot it opened), or None */
static PyObject *Engine_position(Engine *e, PyObject *args) {
    Job *j;
    if (job_arg(e, args, &j) < 0) return NULL;
    if (!j) Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(j->head);
}

/* oldest_open_bitmap(id): the contributor bitmap of the job's oldest open slot (the
 * model's first entry of js.open), or None */
static PyObject *Engine_oldest_open_bitmap(Engine *e, PyObject *args) {
    Job *j;
    if (job_arg(e, args, &j) < 0) return NULL;
    Slot *best = NULL;
    for (size_t k = 0; j && k < 2 * (size_t)j->window; k++) {
        Slot *s = &j->slots[k];
        if (!s->complete && !s->up && (!best || s->order < best->order)) best = s;
    }
    if (!best) Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(best->bitmap);
}

/* awaiting_parent(id): the job's slots that are up (their parent's RESULT awaited) */
static PyObject *Engine_awaiting_parent(Engine *e, PyObject *args) {
    Job *j;
    if (job_arg(e, args, &j) < 0) return NULL;
    long n = 0;
    for (size_t k = 0; j && k < 2 * (size_t)j->window; k++) n += j->slots[k].up;
    return PyLong_FromLong(n);
}

/* active(id): when the job was installed or last accepted DATA, or None */
static PyObject *Engine_active(Engine *e, PyObject *args) {
    Job *j;
    if (job_arg(e, args, &j) < 0) return NULL;
    if (!j) Py_RETURN_NONE;
    return PyFloat_FromDouble(j->active);
}

static PyObject *Engine_open_slots(Engine *e, PyObject *args) {
    Job *j;
    if (job_arg(e, args, &j) < 0) return NULL;
    return PyLong_FromLong(j ? j->nopen : 0);
}

static PyObject *pure_begin(Engine *e) {
    Sink *k = e->sink;
    k->list = PyList_New(0);
    k->failed = 0;
    return k->list;
}

static PyObject *pure_end(Engine *e) {
    Sink *k = e->sink;
    PyObject *out = k->list;
    k->list = NULL;
    if (k->failed) {
        Py_DECREF(out);
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return NULL;
    }
    return out;
}

/* process(datagram, ip, port, now): tick, then the DATA datagram; [(ip, port, bytes)] */
static PyObject *Engine_process(Engine *e, PyObject *args) {
    Py_buffer b;
    unsigned long ip;
    int port;
    double now;
    if (!PyArg_ParseTuple(args, "y*kid", &b, &ip, &port, &now)) return NULL;
    Job *down = result_job(e, b.buf, b.len);
    if (!down && !is_data(e, b.buf, b.len)) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "not a DATA datagram of this version (nor a "
                        "RESULT of a job with a parent)");
        return NULL;
    }
    if (!pure_begin(e)) { PyBuffer_Release(&b); return NULL; }
    tick(e, e->sink, now);
    Addr src = {(uint32_t)ip, (uint16_t)port};
    int r = down ? process_down(e, e->sink, down, b.buf, b.len, src, now)
                 : process_data(e, e->sink, b.buf, b.len, src, now);
    PyBuffer_Release(&b);
    PyObject *out = pure_end(e);
    if (r < 0) { Py_XDECREF(out); return PyErr_NoMemory(); }
    return out;
}

static PyObject *Engine_tick(Engine *e, PyObject *args) {
    double now;
    if (!PyArg_ParseTuple(args, "d", &now)) return NULL;
    if (!pure_begin(e)) return NULL;
    tick(e, e->sink, now);
    return pure_end(e);
}

static PyObject *Engine_next_deadline(Engine *e, PyObject *noargs) {
    double t;
    if (!next_deadline(e, &t)) Py_RETURN_NONE;
    return PyFloat_FromDouble(t);
}

/* the counters ``c`` as a dict by name (``nonzero``: only those not zero) */
static PyObject *counters_dict(const uint64_t *c, int nonzero) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (int i = 0; i < NCOUNTERS; i++) {
        if (nonzero && !c[i]) continue;
        PyObject *v = PyLong_FromUnsignedLongLong(c[i]);
        if (!v || PyDict_SetItemString(d, COUNTER_NAMES[i], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

static PyObject *Engine_counters(Engine *e, PyObject *noargs) {
    return counters_dict(e->c, 0);
}

/* job_counters(id): the job's own counters not zero, or None (no such job) */
static PyObject *Engine_job_counters(Engine *e, PyObject *args) {
    Job *j;
    if (job_arg(e, args, &j) < 0) return NULL;
    if (!j) Py_RETURN_NONE;
    return counters_dict(j->c, 1);
}

/* serve(fd, max_wait): the socket loop for up to max_wait seconds (see the top) */
static PyObject *Engine_serve(Engine *e, PyObject *args) {
    int fd;
    double max_wait;
    if (!PyArg_ParseTuple(args, "id", &fd, &max_wait)) return NULL;
    Sink *k = e->sink;
    k->list = NULL;
    k->fd = fd;
    struct { uint8_t *d; size_t n; Addr a; } others[MAX_OTHERS];
    int nothers = 0, err = 0, oom = 0;
    double end = mono() + max_wait;
    for (int i = 0; i < BATCH; i++) {
        e->riov[i].iov_base = e->rbuf + (size_t)i * RXBUF;
        e->riov[i].iov_len = RXBUF;
    }
    for (int i = 0; i < BATCH; i++) {
        memset(&e->rmsgs[i].msg_hdr, 0, sizeof(struct msghdr));
        e->rmsgs[i].msg_hdr.msg_name = &e->raddr[i];
        e->rmsgs[i].msg_hdr.msg_iov = &e->riov[i];
        e->rmsgs[i].msg_hdr.msg_iovlen = 1;
    }
    for (;;) {
        /* take what is there; wait (ppoll) only when the socket is empty */
        for (int i = 0; i < BATCH; i++)
            e->rmsgs[i].msg_hdr.msg_namelen = sizeof(struct sockaddr_in);
        int r;
        Py_BEGIN_ALLOW_THREADS
        r = recvmmsg(fd, e->rmsgs, BATCH, MSG_DONTWAIT, NULL);
        Py_END_ALLOW_THREADS
        double now = mono(), nd;
        if (r > 0) {
            e->c[C_RX_BATCHES]++;
            for (int i = 0; i < r; i++) {
                const uint8_t *d = e->riov[i].iov_base;
                size_t n = e->rmsgs[i].msg_len;
                Addr src = {ntohl(e->raddr[i].sin_addr.s_addr), ntohs(e->raddr[i].sin_port)};
                Job *down = result_job(e, d, n);
                if (down) {
                    tick(e, k, now);
                    process_down(e, k, down, d, n, src, now);
                } else if (is_data(e, d, n)) {
                    tick(e, k, now);
                    if (process_data(e, k, d, n, src, now) < 0) { oom = 1; break; }
                } else {                     /* at most BATCH: we return after this one */
                    uint8_t *copy = malloc(n ? n : 1);
                    if (!copy) { oom = 1; break; }
                    memcpy(copy, d, n);
                    others[nothers].d = copy;
                    others[nothers].n = n;
                    others[nothers].a = src;
                    nothers++;
                }
            }
            tick(e, k, now);
            sink_drain(e, k, now);
            if (oom || nothers || now >= end) break;
            continue;
        }
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                errno != ECONNREFUSED) {
            err = errno;
            break;
        }
        tick(e, k, now);
        sink_drain(e, k, now);
        if (now >= end) break;
        double until = end;
        if (next_deadline(e, &nd) && nd < until) until = nd;
        if (e->pace_wake && e->pace_wake < until) until = e->pace_wake;
        double wait = until - now;
        if (wait < 0) wait = 0;
        struct timespec ts = {(time_t)wait, (long)((wait - (time_t)wait) * 1e9)};
        struct pollfd pf = {fd, POLLIN, 0};
        Py_BEGIN_ALLOW_THREADS
        r = ppoll(&pf, 1, &ts, NULL);
        Py_END_ALLOW_THREADS
        if (r < 0) {
            if (errno == EINTR) break;       /* let Python run its signal handlers */
            err = errno;
            break;
        }
    }
    if (e->pace <= 0.0) sink_flush(e, k);   /* paced: the queue waits for the next serve */
    PyObject *out = PyList_New(0);
    for (int i = 0; i < nothers; i++) {
        if (out) {
            PyObject *t = Py_BuildValue("(y#ki)", others[i].d, (Py_ssize_t)others[i].n,
                                        (unsigned long)others[i].a.ip, (int)others[i].a.port);
            if (!t || PyList_Append(out, t) < 0) Py_CLEAR(out);
            Py_XDECREF(t);
        }
        free(others[i].d);
    }
    if (oom) { Py_XDECREF(out); return PyErr_NoMemory(); }
    if (err) {
        Py_XDECREF(out);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return out;
}

/* set_pool(slots, (ip, port)): the shared slot pool of ``slots`` slots, its overflow to
 * the parent at (ip, port); set_pool(-1, None): no pool (the model's pool_slots None) */
static PyObject *Engine_set_pool(Engine *e, PyObject *args) {
    long slots;
    PyObject *parent;
    if (!PyArg_ParseTuple(args, "lO", &slots, &parent)) return NULL;
    if (slots < 0) {
        e->pool = 0;
        Py_RETURN_NONE;
    }
    unsigned long ip;
    int port;
    if (!PyArg_ParseTuple(parent, "ki", &ip, &port)) return NULL;
    e->pool = 1;
    e->pool_slots = slots;
    e->pool_mark = slots - slots / POOL_MARK_DIV;
    e->pool_parent.ip = (uint32_t)ip;
    e->pool_parent.port = (uint16_t)port;
    Py_RETURN_NONE;
}

static PyObject *Engine_pool_used(Engine *e, PyObject *noargs) {
    return PyLong_FromLong(e->pool_used);
}

/* set_pace(bps): serve mode, no faster than bps bit/s to any one destination (0: off) */
static PyObject *Engine_set_pace(Engine *e, PyObject *args) {
    double bps;
    if (!PyArg_ParseTuple(args, "d", &bps)) return NULL;
    if (!(bps >= 0.0) || bps > 1e12) {
        PyErr_Format(PyExc_ValueError, "pace %g bit/s: need 0 (off) .. 1e12", bps);
        return NULL;
    }
    if (e->pace > 0.0 && bps <= 0.0 && e->sink->n && !e->sink->list) sink_flush(e, e->sink);
    e->pace = bps;
    Py_RETURN_NONE;
}

/* set_gso(on): serve mode, runs of RESULTs to one destination go as GSO sends (off by
 * default); returns whether they did */
static PyObject *Engine_set_gso(Engine *e, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    int was = e->sink->gso;
    e->sink->gso = on;
    return PyBool_FromLong(was);
}

static PyMethodDef Engine_methods[] = {
    {"set_gso", (PyCFunction)Engine_set_gso, METH_VARARGS,
     "set_gso(on): serve mode, runs of datagrams to one destination go as one UDP GSO "
     "send (off by default); returns the previous setting"},
    {"set_pool", (PyCFunction)Engine_set_pool, METH_VARARGS, "the shared slot pool"},
    {"pool_used", (PyCFunction)Engine_pool_used, METH_NOARGS, "pool slots held now"},
    {"set_pace", (PyCFunction)Engine_set_pace, METH_VARARGS,
     "set_pace(bps): serve mode, RESULTs to any one destination no faster than bps bit/s "
     "(0: off, the default)"},
    {"add_job", (PyCFunction)Engine_add_job, METH_VARARGS,
     "add_job(id, members, window, elements, mode, deadline, group, session, now): "
     "install afresh (mode: 0 reliable, 1 bounded, 2 bounded-skip)"},
    {"absent", (PyCFunction)Engine_absent, METH_VARARGS,
     "absent(id): the bitmap of workers a bounded-skip job skips"},
    {"active", (PyCFunction)Engine_active, METH_VARARGS,
     "active(id): when the job was installed or last accepted DATA, or None"},
    {"remove_job", (PyCFunction)Engine_remove_job, METH_VARARGS, "remove_job(id)"},
    {"retune", (PyCFunction)Engine_retune, METH_VARARGS,
     "retune(id, mode, deadline): change the mode/deadline, keeping the slots"},
    {"start_at", (PyCFunction)Engine_start_at, METH_VARARGS,
     "start_at(id, seq): records as if the job had run seq packets"},
    {"oldest_open_bitmap", (PyCFunction)Engine_oldest_open_bitmap, METH_VARARGS,
     "oldest_open_bitmap(id): contributors of the oldest open slot, or None"},
    {"open_slots", (PyCFunction)Engine_open_slots, METH_VARARGS, "open_slots(id)"},
    {"position", (PyCFunction)Engine_position, METH_VARARGS, "position(id): the job's head"},
    {"process", (PyCFunction)Engine_process, METH_VARARGS,
     "process(datagram, ip, port, now) -> [(ip, port, bytes)]: tick, then one DATA"},
    {"tick", (PyCFunction)Engine_tick, METH_VARARGS, "tick(now) -> [(ip, port, bytes)]"},
    {"next_deadline", (PyCFunction)Engine_next_deadline, METH_NOARGS,
     "earliest time at which tick has work, or None"},
    {"counters", (PyCFunction)Engine_counters, METH_NOARGS, "counters as a dict"},
    {"job_counters", (PyCFunction)Engine_job_counters, METH_VARARGS,
     "job_counters(id): the job's own counters not zero, as a dict (None: no such job)"},
    {"awaiting_parent", (PyCFunction)Engine_awaiting_parent, METH_VARARGS,
     "slots of a job sent to the parent, its RESULT awaited"},
    {"serve", (PyCFunction)Engine_serve, METH_VARARGS,
     "serve(fd, max_wait) -> [(bytes, ip, port)]: the batch socket loop; returns the "
     "datagrams that are not DATA"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ina_fabric.host.switch._engine.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The switch's compiled DATA path (see the module source for the design).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Engine_init,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_methods = Engine_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_engine", "The software switch's compiled data path.", -1, NULL,
};

PyMODINIT_FUNC PyInit__engine(void) {
    if (PyType_Ready(&EngineType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
        Py_DECREF(&EngineType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "BATCH", BATCH);
    return m;
}
