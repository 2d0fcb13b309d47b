/*
 * The worker's allreduce call, compiled: ``run_call`` is SwitchClient.allreduce's socket
 * loop with the GIL released for the whole call (a DDP bucket on the hook's thread runs
 * beside backward), and ``Window`` is host/transport/window.py's SendWindow, the same rules
 * event for event, so that tests/test_window_machine.py's properties check both.
 *
 * The Python modules stay the definition: window.py (SendWindow, RttEstimator) for the
 * window and timers, switch_client.py (AllreduceCall) for packets and results, and
 * quantize.py for the fixed point (the pack and dequantize loops below are the same
 * float64 arithmetic, bit for bit). The socket loop takes what is there on both sockets
 * with recvmmsg and sends with sendmmsg; it waits in poll only when nothing came in and
 * no timer is due. What it does not handle (an impaired uplink, which wraps the Python
 * socket) runs the Python loop.
 *
 * Why C: the Python loop spends about 25 of its 43 us per 64 KB datagram in the
 * interpreter (issue 15's profile), and numba cannot make the system calls.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "ina_wire.h"
#include "ina_gso.h"

#define PEAK_FACTOR 2.0          /* window.py */
#define FAST_RESEND 3            /* window.py */
#define MAX_BACKOFF 64
#define LOCAL_RETRIES 200        /* switch_client.LOCAL_RETRIES: a datagram the host's */
#define LOCAL_RETRY_NS 100000    /* own queue dropped goes again, 0.1 ms apart */
#define LOCAL_WAITS 100          /* switch_client.LOCAL_WAITS, LOCAL_WAIT_S: a send the */
#define LOCAL_WAIT_MS 10         /* full send buffer refuses waits for it to drain */
/* at most 4 datagrams (each at most an MTU) per GSO send: a qdisc takes or drops a send
 * whole, and IP_RECVERR reports a drop, except tbf, which cuts a send larger than its
 * bucket into datagrams and drops those that do not fit without a word; the lab's tbf
 * bucket holds at least 4 MTUs (host/lab/netns.py shape) */
#define GSO_MAX_SEGS 4
#define UDP_IP_BYTES 46         /* IPv4 + UDP + Ethernet: slot_deadline.UDP_IP_BYTES */
#define BOUNDED_MAX_BACKOFF 4   /* window.py: a bounded re-send fetches a stored result */
/* congestion control: window.py's constants of the same names (docs/congestion.md) */
#define LOSS_BETA 0.5
#define CONGESTED_BETA 0.8       /* window.py's */
#define REORDER_RTTS 2.0         /* window.py's: no FAST_RESEND so soon after CONGESTED */
#define DELAY_BETA 0.8
#define MAX_DELAY_CUT 0.5
#define DELAY_FACTOR 1.5
#define DELAY_SLACK 0.002
#define MIN_CWND 1.0
/* reading RESULTs in batches: window.py's COALESCE_* (SendWindow.coalesce) */
#define COALESCE_MIN_INFLIGHT 16
#define COALESCE_SHARE 0.25
#define COALESCE_MAX 200e-6
#define COALESCE_GAPS 2.0
#define RBATCH 8                 /* 8 x 64 KB still in L2 when dequantized */
#define RXBUF 65536
#define SENDQ 64

enum { A_SEND = 1, A_DELIVER, A_ABANDON, A_HOLD, A_FAIL };
enum { FAIL_UNAVAILABLE = 0, FAIL_STALLED = 1 };
enum { RC_OK = 0, RC_UNAVAILABLE, RC_STALLED, RC_INCONSISTENT, RC_TOO_LATE, RC_REFUSED,
       RC_MEMBERS_DIFFER, RC_INTERRUPTED };
#define REFUSAL_STALE 5          /* fields.Refusal.STALE */
enum { S_SENT, S_RETRANSMITS, S_RESULTS, S_DUPLICATES, S_PARTIAL, S_LOST, S_OVERFLOW,
       S_CLIPPED, S_ABANDONED, S_FOREIGN, S_REFETCHED, S_LOCAL_RETRIES,
       S_COALESCED, S_LOCAL_WAITS, NSTATS };
enum { T_SRTT, T_RTTVAR, T_ANSWERED, T_PEAK, T_LAST_PEAK, T_CWND, T_SSTHRESH, T_BASE,
       T_CUT_AT, T_CUTS, T_CONGESTED_AT, NRTT };   /* window.py's RttEstimator fields, in order */
#define NCFG 8                     /* fastcall.config_tuple */

/* ---- the window (window.py's SendWindow and RttEstimator) ------------------------- */
typedef struct { int kind, p, flag; } Action;

typedef struct {
    int P, W, bounded, cc, delay;
    double rto0, min_rto, deadline, connect_timeout, stall_timeout, start_wait;
    double *rtt;                   /* RttEstimator: srtt, rttvar, ... (T_*) */
    int *ready, nready, qhead;     /* released packets waiting for cwnd, release order */
    uint8_t *state;                /* 0 not released, 1 released and waiting, 2 sent */
    int low;                       /* no packet below it lacks its result */
    double t_first;                /* when the call's first RESULT came in */
    int *lost, nlostq, caplost, lhead;  /* reliable: packets marked lost at a timeout, */
    uint8_t *lostf;                /* not re-sent yet (flag), nlost of them */
    int nlost;
    uint8_t *received, *held, *where;   /* where: 0 none, 1 fresh, 2 resent */
    uint8_t *tries;                /* 0: never re-sent (Karn: RTT samples allowed) */
    uint8_t *later;                /* results in of packets sent after it (FAST_RESEND) */
    double *tsent;
    int *prev, *next;              /* the fresh and the resent list, by send order */
    int fhead, ftail, rhead, rtail, nfresh, nresent;
    int remaining, started;
    double last_progress;
    Action *act;
    int nact, capact;
    int *scratch;                  /* on_timer's overdue list */
} Win;

static int win_init(Win *w, int P, int W, const double cfg[NCFG], double *rtt) {
    memset(w, 0, sizeof *w);
    w->P = P; w->W = W;
    w->bounded = cfg[0] != 0.0;
    w->rto0 = cfg[1]; w->min_rto = cfg[2]; w->deadline = cfg[3];
    w->connect_timeout = cfg[4]; w->stall_timeout = cfg[5]; w->start_wait = cfg[6];
    w->cc = cfg[7] != 0.0;           /* fastcall.config_tuple: 0 off, 1 aimd, 2 delay */
    w->delay = cfg[7] == 2.0;
    w->rtt = rtt;
    w->ready = malloc(P * sizeof(int)); w->state = calloc(P, 1);
    w->caplost = P;
    w->lost = malloc(P * sizeof(int)); w->lostf = calloc(P, 1);
    w->t_first = INFINITY;
    if (!w->ready || !w->state || !w->lost || !w->lostf) return -1;
    if (w->cc && rtt[T_CWND] == 0.0) rtt[T_CWND] = (double)W;   /* the first call */
    w->received = calloc(P, 1); w->held = calloc(P, 1); w->where = calloc(P, 1);
    w->tries = calloc(P, 1); w->tsent = calloc(P, sizeof(double));
    w->later = calloc(P, 1);
    w->prev = malloc(P * sizeof(int)); w->next = malloc(P * sizeof(int));
    w->scratch = malloc(P * sizeof(int));
    w->capact = 2 * P + 16;
    w->act = malloc(w->capact * sizeof(Action));
    if (!w->received || !w->held || !w->where || !w->tries || !w->tsent || !w->later ||
            !w->prev ||
            !w->next || !w->scratch || !w->act)
        return -1;
    w->fhead = w->ftail = w->rhead = w->rtail = -1;
    w->remaining = P;
    rtt[T_LAST_PEAK] = rtt[T_PEAK];          /* RttEstimator.new_call */
    rtt[T_PEAK] = 0.0;
    return 0;
}

static void win_free(Win *w) {
    free(w->received); free(w->held); free(w->where); free(w->tries); free(w->tsent);
    free(w->later); free(w->prev); free(w->next); free(w->scratch); free(w->act);
    free(w->ready); free(w->state); free(w->lost); free(w->lostf);
}

static double win_rto(const Win *w) {
    const double *r = w->rtt;
    double base;
    if (r[T_SRTT] == 0.0) {
        base = w->rto0;
    } else {
        double pk = r[T_PEAK] > r[T_LAST_PEAK] ? r[T_PEAK] : r[T_LAST_PEAK];
        base = r[T_SRTT] + 4 * r[T_RTTVAR];
        if (w->min_rto > base) base = w->min_rto;
        if (PEAK_FACTOR * pk > base) base = PEAK_FACTOR * pk;
        if (base > 1.0) base = 1.0;
    }
    return base;   /* bounded too: window.py's RttEstimator.rto (issue 18, run 4) */
}

static double win_timeout(const Win *w) {
    double rto = win_rto(w);
    if (!w->started && !w->bounded && rto < w->start_wait) return w->start_wait;
    return rto;
}

static double win_giveup(const Win *w) {
    double base = win_rto(w);
    if (w->bounded) {
        double b = w->deadline * 1.5 + 0.002;
        if (b > base) base = b;
    }
    double g = 20 * base;
    return g > 0.5 ? g : 0.5;
}

static void rtt_sample(double *r, double s) {
    if (r[T_SRTT] == 0.0) {
        r[T_SRTT] = s;
        r[T_RTTVAR] = s / 2;
    } else {
        r[T_RTTVAR] = 0.75 * r[T_RTTVAR] + 0.25 * fabs(r[T_SRTT] - s);
        r[T_SRTT] = 0.875 * r[T_SRTT] + 0.125 * s;
    }
    if (s > r[T_PEAK]) r[T_PEAK] = s;
}

static void push(Win *w, int kind, int p, int flag) {
    if (w->nact == w->capact) {           /* cannot happen: at most P + W per event */
        w->capact *= 2;
        w->act = realloc(w->act, w->capact * sizeof(Action));
    }
    w->act[w->nact++] = (Action){kind, p, flag};
}

static void unlink_p(Win *w, int p) {
    int list = w->where[p];
    if (!list) return;
    int *head = list == 1 ? &w->fhead : &w->rhead, *tail = list == 1 ? &w->ftail : &w->rtail;
    if (w->prev[p] >= 0) w->next[w->prev[p]] = w->next[p]; else *head = w->next[p];
    if (w->next[p] >= 0) w->prev[w->next[p]] = w->prev[p]; else *tail = w->prev[p];
    if (list == 1) w->nfresh--; else w->nresent--;
    w->where[p] = 0;
}

static void append(Win *w, int p, int list) {
    int *head = list == 1 ? &w->fhead : &w->rhead, *tail = list == 1 ? &w->ftail : &w->rtail;
    w->prev[p] = *tail;
    w->next[p] = -1;
    if (*tail >= 0) w->next[*tail] = p; else *head = p;
    *tail = p;
    w->where[p] = list;
    if (list == 1) w->nfresh++; else w->nresent++;
}

static void unlose(Win *w, int p) {
    if (w->lostf[p]) {
        w->lostf[p] = 0;
        w->nlost--;
    }
}

static void win_send(Win *w, int p, double now, int retransmit) {
    if (retransmit) {
        unlose(w, p);
        int t = w->tries[p] ? w->tries[p] * 2 : 2;
        int cap = w->bounded ? BOUNDED_MAX_BACKOFF : MAX_BACKOFF;
        w->tries[p] = t > cap ? cap : t;
        unlink_p(w, p);
        append(w, p, 2);
    } else {
        unlink_p(w, p);
        append(w, p, 1);
        w->state[p] = 2;
    }
    w->tsent[p] = now;
    push(w, A_SEND, p, retransmit);
}

/* window.py's SendWindow.limit */
static int win_limit(const Win *w) {
    if (!w->cc) return w->W;
    int c = (int)w->rtt[T_CWND];
    return c < w->W ? c : w->W;
}

/* window.py's SendWindow._pump */
static void win_pump(Win *w, double now) {
    int limit = win_limit(w), i = w->lhead;
    while (i < w->nlostq && w->nfresh + w->nresent - w->nlost < limit) {
        int p = w->lost[i++];
        if (w->lostf[p]) win_send(w, p, now, 1);
    }
    w->lhead = i;
    i = w->qhead;
    while (i < w->nready && w->nfresh + w->nresent - w->nlost < limit) {
        int p = w->ready[i++];
        if (w->state[p] == 1 && !w->received[p]) win_send(w, p, now, 0);
    }
    w->qhead = i;
    int lo = w->low;
    while (lo < w->P && w->received[lo]) lo++;
    w->low = lo;
    if (lo < w->P && w->state[lo] == 1) win_send(w, lo, now, 0);
}

/* window.py's SendWindow._cut */
static void win_cut(Win *w, double now, double factor);
/* window.py's on_local_congestion: this host's own queue refused a send */
static void win_local(Win *w, double now) {
    if (w->cc) win_cut(w, now, LOSS_BETA);
}

static void win_cut(Win *w, double now, double factor) {
    double *r = w->rtt;
    if (now - r[T_CUT_AT] < r[T_SRTT]) return;
    double c = r[T_CWND] < w->W ? r[T_CWND] : (double)w->W;
    c *= factor;
    r[T_CWND] = c > MIN_CWND ? c : MIN_CWND;
    r[T_SSTHRESH] = r[T_CWND];
    r[T_CUT_AT] = now;
    r[T_CUTS] += 1;
}

/* window.py's SendWindow._grow */
static void win_grow(Win *w) {
    double *r = w->rtt;
    if (r[T_CWND] < w->W) {
        double c = r[T_CWND] + (r[T_CWND] < r[T_SSTHRESH] ? 1.0 : 1.0 / r[T_CWND]);
        r[T_CWND] = c < w->W ? c : (double)w->W;
    }
}

/* window.py's SendWindow._on_rtt */
static void win_on_rtt(Win *w, double s, double t_sent, double now) {
    if (!w->delay) {
        win_grow(w);
        return;
    }
    if (t_sent < w->t_first) return;
    double *r = w->rtt;
    double target = DELAY_FACTOR * r[T_BASE] + DELAY_SLACK;
    if (s > target) {
        double f = 1.0 - DELAY_BETA * (s - target) / s;
        win_cut(w, now, f > 1.0 - MAX_DELAY_CUT ? f : 1.0 - MAX_DELAY_CUT);
    } else {
        win_grow(w);
    }
}

static void win_release(Win *w, int q, double now) {
    while (q < w->P) {
        if (!w->held[q]) {        /* it may go: win_pump sends it */
            w->ready[w->nready++] = q;
            w->state[q] = 1;
            return;
        }
        w->held[q] = 0;
        push(w, A_DELIVER, q, 0);
        q += w->W;
    }
}

static void win_start(Win *w, double now) {
    w->last_progress = now;
    int n = w->W < w->P ? w->W : w->P;
    for (int p = 0; p < n; p++) {
        w->ready[w->nready++] = p;
        w->state[p] = 1;
    }
    win_pump(w, now);
}

static void win_on_result(Win *w, int p, double now, int congested) {
    w->started = 1;
    if (w->t_first == INFINITY) w->t_first = now;
    if (w->received[p]) return;
    w->received[p] = 1;
    w->remaining--;
    w->last_progress = now;
    w->rtt[T_ANSWERED] = 1.0;
    int q = p - w->W;
    if (q >= 0 && (!w->received[q] || w->held[q])) {
        w->held[p] = 1;
        push(w, A_HOLD, p, 0);
        return;
    }
    double t = INFINITY;
    int sampled = 0;
    unlose(w, p);
    if (w->where[p]) {
        t = w->tsent[p];
        unlink_p(w, p);
        /* (t is INFINITY while the pacer still holds p: bounded mode, its slot closed
         * at the deadline before p went; no sample then) */
        if (!w->tries[p] && t <= now) {
            rtt_sample(w->rtt, now - t);
            double *r = w->rtt;         /* not before the first RESULT: late peers */
            if (t >= w->t_first && (r[T_BASE] == 0.0 || now - t < r[T_BASE]))
                r[T_BASE] = now - t;
            if (w->cc && !congested) win_on_rtt(w, now - t, t, now);
            sampled = 1;
        }
    }
    if (!sampled && w->cc && !congested) win_grow(w);   /* no sample (Karn): ACK clock */
    if (w->cc && congested) {                           /* the switch's slots */
        win_cut(w, now, CONGESTED_BETA);
        w->rtt[T_CONGESTED_AT] = now;
    }
    push(w, A_DELIVER, p, 0);
    win_release(w, p + w->W, now);
    win_pump(w, now);
    /* fast re-send (window.py's FAST_RESEND), not while the pool marks (REORDER_RTTS) */
    if (t < INFINITY && !(w->cc && now - w->rtt[T_CONGESTED_AT] <=
                                   REORDER_RTTS * w->rtt[T_SRTT])) {
        int n = 0;
        for (int q = w->fhead; q >= 0 && w->tsent[q] < t; q = w->next[q])
            if (++w->later[q] == FAST_RESEND) w->scratch[n++] = q;
        for (int i = 0; i < n; i++) win_send(w, w->scratch[i], now, 1);
        if (n && w->cc) win_cut(w, now, LOSS_BETA);
    }
}

/* window.py's SendWindow.coalesce: how long the loop may wait before it reads again */
static double win_coalesce(const Win *w) {
    const double *r = w->rtt;
    int n = w->nfresh + w->nresent - w->nlost;
    if (r[T_BASE] == 0.0 || n < COALESCE_MIN_INFLIGHT) return 0.0;
    double d = (r[T_SRTT] - r[T_BASE]) * COALESCE_SHARE;
    if (d > COALESCE_MAX) d = COALESCE_MAX;
    if (d <= 0.0 || d * n < COALESCE_GAPS * r[T_SRTT]) return 0.0;
    return d;
}

static int win_next_wakeup(const Win *w, double *t) {
    double rto = win_timeout(w);
    int have = 0;
    if (w->fhead >= 0) {
        *t = w->tsent[w->fhead] + rto;
        have = 1;
    }
    if (w->rhead >= 0) {
        double r = INFINITY;
        for (int p = w->rhead; p >= 0; p = w->next[p]) {
            double x = w->tsent[p] + rto * w->tries[p];
            if (x < r) r = x;
        }
        if (!have || r < *t) *t = r;
        have = 1;
    }
    return have;
}

static void win_on_timer(Win *w, double now) {
    double rto = win_timeout(w);
    int n = 0, nf = 0;
    int *od = w->scratch;
    for (int p = w->fhead; p >= 0; p = w->next[p]) {
        if (now < w->tsent[p] + rto) break;
        od[n++] = p;
    }
    nf = n;
    int late = 0;
    for (int p = w->rhead; p >= 0; p = w->next[p])
        if (now >= w->tsent[p] + rto * w->tries[p]) late++;
    if (late) {
        /* merge by last send time, fresh first on ties (a stable sort of fresh + late) */
        int *lt = malloc(late * sizeof(int)), *fr = malloc((nf ? nf : 1) * sizeof(int));
        int k = 0;
        for (int p = w->rhead; p >= 0; p = w->next[p])
            if (now >= w->tsent[p] + rto * w->tries[p]) lt[k++] = p;
        memcpy(fr, od, nf * sizeof(int));
        int i = 0, j = 0;
        n = 0;
        while (i < nf || j < late) {
            if (j >= late || (i < nf && w->tsent[fr[i]] <= w->tsent[lt[j]])) od[n++] = fr[i++];
            else od[n++] = lt[j++];
        }
        free(lt);
        free(fr);
    }
    if (!n) return;
    double idle = now - w->last_progress;
    if (w->rtt[T_ANSWERED] == 0.0 && idle > w->connect_timeout) {
        push(w, A_FAIL, FAIL_UNAVAILABLE, 0);
        return;
    }
    if (w->bounded && idle > win_giveup(w)) {
        for (int i = 0; i < n; i++) {
            int p = od[i];
            w->received[p] = 1;
            w->remaining--;
            unlose(w, p);
            unlink_p(w, p);
            push(w, A_ABANDON, p, 0);
            win_release(w, p + w->W, now);
            win_pump(w, now);
        }
        w->last_progress = now;
        return;
    }
    if (!w->bounded && idle > w->stall_timeout) {
        push(w, A_FAIL, FAIL_STALLED, 0);
        return;
    }
    if (w->cc && w->started) {
        /* a loss (before the call's first RESULT: late peers, not the network) */
        win_cut(w, now, LOSS_BETA);
        if (!w->bounded) {        /* window.py: at most the cut window re-sent at once */
            int lim = win_limit(w);
            for (int i = lim; i < n; i++) {   /* the others: marked lost, their timers */
                int p = od[i], list = w->where[p];  /* restart unsent; win_pump */
                unlink_p(w, p);                     /* re-sends them first */
                append(w, p, list);
                w->tsent[p] = now;
                if (!w->lostf[p]) {
                    w->lostf[p] = 1;
                    w->nlost++;
                    if (w->nlostq == w->caplost) {
                        /* full: keep the first entry of each packet still marked
                         * (win_pump skips the others: the same order) */
                        uint8_t *seen = calloc(w->P, 1);
                        int k = 0;
                        for (int j = w->lhead; seen && j < w->nlostq; j++) {
                            int x = w->lost[j];
                            if (w->lostf[x] && !seen[x]) {
                                seen[x] = 1;
                                w->lost[k++] = x;
                            }
                        }
                        free(seen);
                        w->nlostq = k;
                        w->lhead = 0;
                    }
                    w->lost[w->nlostq++] = p;
                }
            }
            if (n > lim) n = lim;
        }
    }
    for (int i = 0; i < n; i++) win_send(w, od[i], now, 1);
}

/* ---- the call's data side (switch_client.py's AllreduceCall) ---------------------- */
typedef struct {
    InaLayout L;
    const float *x;
    float *out;
    int64_t n;
    int E, K, P, W, job, worker, nworkers, sbits;
    uint32_t base;
    uint64_t session;            /* the run's: every DATA carries it, RESULTs must */
    uint8_t *ring;
    size_t stride;
    int *slot_p;
    uint8_t *slot_pending;
    const int8_t *local_exp;
    int16_t *shared_exp;
    uint8_t **heldbuf;
    int64_t *stats;
    uint8_t *missed;             /* carry mode: a flag per chunk left out (else NULL) */
    int code, stochastic;        /* element width code (0 int32, 1 int16, 2 int8) and
                                    rounding (docs/precision.md) */
    uint64_t seed;               /* stochastic rounding: the call's shared seed */
    int refusal, refused_p;      /* RC_REFUSED: the switch's reason, for packet refused_p
                                    (-1: a DATA of an earlier call) of seq refused_seq */
    uint32_t refusal_figure, refused_seq;
    /* a STALE answer whose figure (the job's position) is more than this past the
     * call's base: this worker is behind the job (2 x the job's window) */
    uint32_t stale_after;
    /* RC_INTERRUPTED: the exception a signal handler raised while the loop waited */
    PyObject *exc_type, *exc_value, *exc_tb;
} Call;

static inline int nelem_of(const Call *c, int p) {
    if (p < c->W) return 0;
    int64_t left = c->n - (int64_t)(p - c->W) * c->E;
    return left < c->E ? (int)left : c->E;
}

/* quantize.py's _pack and _dequant, the same float64 arithmetic bit for bit: scale,
 * clamp, round half to even, big-endian; and big-endian int32 times a factor to float32.
 * An AVX2 form (chosen at load time where the CPU has it, as numba's kernels are built
 * for the host CPU) and a portable one. The AVX2 form rounds with cvtpd2dq, which rounds
 * as the MXCSR says: to nearest even, Python's and numpy's mode, the same as rint. */
#if defined(__x86_64__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
__attribute__((target("avx2")))
static int64_t pack_avx2(const float *v, int count, double scale, uint8_t *dst) {
    const __m256d lo = _mm256_set1_pd(-2147483647.0), hi = _mm256_set1_pd(2147483647.0);
    const __m256d s = _mm256_set1_pd(scale);
    const __m128i swap = _mm_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12);
    int64_t clipped = 0;
    int i = 0;
    for (; i + 4 <= count; i += 4) {
        if ((i & 15) == 0) _mm_prefetch((const char *)(v + i + 512), _MM_HINT_T0);
        __m256d x = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(v + i)), s);
        __m256d c = _mm256_min_pd(_mm256_max_pd(x, lo), hi);
        clipped += __builtin_popcount(_mm256_movemask_pd(_mm256_cmp_pd(c, x, _CMP_NEQ_UQ)));
        __m128i q = _mm_shuffle_epi8(_mm256_cvtpd_epi32(c), swap);
        _mm_storeu_si128((__m128i *)(dst + 4 * (size_t)i), q);
    }
    for (; i < count; i++) {
        double x = (double)v[i] * scale;
        double c = x < -2147483647.0 ? -2147483647.0 : (x > 2147483647.0 ? 2147483647.0 : x);
        clipped += c != x;
        ina_put_be32(dst + 4 * (size_t)i, (uint32_t)(int32_t)rint(c));
    }
    return clipped;
}

__attribute__((target("avx2")))
static void dequant_avx2(const uint8_t *q, int nel, double factor, float *o) {
    const __m256d f = _mm256_set1_pd(factor);
    const __m128i swap = _mm_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12);
    int i = 0;
    for (; i + 4 <= nel; i += 4) {
        __m128i x = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(q + 4 * (size_t)i)),
                                     swap);
        _mm_storeu_ps(o + i, _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtepi32_pd(x), f)));
    }
    for (; i < nel; i++) {
        o[i] = (float)((double)ina_be32(q + 4 * (size_t)i) * factor);
    }
}

/* The same two loops in float32, 8 elements a step instead of 4, where float32 gives
 * the float64 forms' bits (chosen per packet by pack and dequant below):
 * - pack, a scale 2^k that is a normal float32 (-126 <= k <= 127): v * 2^k is exact in
 *   float32 as in float64 (v has 24 significant bits) wherever the product is a normal
 *   float32; a product below 2^-126 rounds to the integer 0 either way. Every |x| below
 *   2^31 is then the same float64 value, rounded to nearest even by cvtps2dq as by
 *   cvtpd2dq, and no float32 lies between 2^31 - 1 and 2^31. Any |x| >= 2^31 (clamped
 *   and counted), an overflow to inf, or a NaN (not a number the clamp may see)
 *   sends the packet to the float64 form, which writes it all again.
 * - dequantize, a factor 2^k with -126 <= k <= 96 (a complete result; a partial one
 *   rescales by N / count, no power of two): float32(v) * 2^k, rounded once to nearest
 *   even, is float32(v * 2^k), since scaling by 2^k commutes with the rounding in the
 *   normal range, and |v| in [1, 2^31] keeps the product in it. */
__attribute__((target("avx2")))
static int pack_avx2f(const float *v, int count, float scale, uint8_t *dst,
                      int64_t *clipped) {
    const __m256 s = _mm256_set1_ps(scale), lim = _mm256_set1_ps(2147483648.0f);
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256i swap = _mm256_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13,
                                          12, 3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14,
                                          13, 12);
    __m256 out = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= count; i += 8) {
        if ((i & 15) == 0) _mm_prefetch((const char *)(v + i + 512), _MM_HINT_T0);
        __m256 x = _mm256_mul_ps(_mm256_loadu_ps(v + i), s);
        /* not below 2^31 in magnitude, or unordered (NaN) */
        out = _mm256_or_ps(out, _mm256_cmp_ps(_mm256_and_ps(x, magnitude), lim,
                                              _CMP_NLT_UQ));
        _mm256_storeu_si256((__m256i *)(dst + 4 * (size_t)i),
                            _mm256_shuffle_epi8(_mm256_cvtps_epi32(x), swap));
    }
    if (_mm256_movemask_ps(out)) return 0;
    int64_t n = 0;
    for (; i < count; i++) {      /* the tail as pack_avx2's */
        double x = (double)v[i] * (double)scale;
        double c = x < -2147483647.0 ? -2147483647.0 : (x > 2147483647.0 ? 2147483647.0 : x);
        n += c != x;
        ina_put_be32(dst + 4 * (size_t)i, (uint32_t)(int32_t)rint(c));
    }
    *clipped = n;
    return 1;
}

__attribute__((target("avx2")))
static void dequant_avx2f(const uint8_t *q, int nel, float factor, float *o) {
    const __m256 f = _mm256_set1_ps(factor);
    const __m256i swap = _mm256_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13,
                                          12, 3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14,
                                          13, 12);
    int i = 0;
    for (; i + 8 <= nel; i += 8) {
        __m256i x = _mm256_shuffle_epi8(
            _mm256_loadu_si256((const __m256i *)(q + 4 * (size_t)i)), swap);
        _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_cvtepi32_ps(x), f));
    }
    for (; i < nel; i++) o[i] = (float)((double)ina_be32(q + 4 * (size_t)i) * factor);
}
#endif

#define TARGETS __attribute__((target_clones("avx2", "default")))

static int64_t pack_portable(const float *v, int count, double scale, uint8_t *dst) {
    int64_t clipped = 0;
    for (int i = 0; i < count; i++) {
        double x = (double)v[i] * scale;
        double c = x < -2147483647.0 ? -2147483647.0 : (x > 2147483647.0 ? 2147483647.0 : x);
        clipped += c != x;
        ina_put_be32(dst + 4 * (size_t)i, (uint32_t)(int32_t)rint(c));
    }
    return clipped;
}

static void dequant_portable(const uint8_t *q, int nel, double factor, float *o) {
    for (int i = 0; i < nel; i++) {
        o[i] = (float)((double)ina_be32(q + 4 * (size_t)i) * factor);
    }
}

static int use_avx2 = -1;

static int avx2(void) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2 < 0) use_avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    return use_avx2;
#else
    return 0;
#endif
}

static int64_t pack(const float *v, int count, int exponent, int sbits, uint8_t *dst,
                    int no_exponent, int nonfinite) {
    if (exponent == no_exponent || exponent == nonfinite) {   /* zeros, as quantize.py */
        memset(dst, 0, 4 * (size_t)count);
        return 0;
    }
    double scale = ldexp(1.0, sbits - exponent);
#ifdef HAVE_AVX2_PATH
    if (avx2()) {
        int64_t clipped;
        if (scale >= 0x1p-126 && scale <= 0x1p127 &&
                pack_avx2f(v, count, (float)scale, dst, &clipped))
            return clipped;
        return pack_avx2(v, count, scale, dst);
    }
#endif
    return pack_portable(v, count, scale, dst);
}

/* quantize.py's _mix, chunk_key, _packw and _dequantw (issue 40): any width, rounding to
 * nearest even or stochastic floor(x + u), u from splitmix64 over (key, element) */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t chunk_key(uint64_t seed, uint32_t seq, int worker) {
    return mix64(seed + mix64(((uint64_t)seq << 8) | (uint64_t)(worker & 0xFF)));
}

static int64_t packw(const float *v, int count, int exponent, int sbits, uint8_t *dst,
                     int no_exponent, int nonfinite, int code, int stochastic,
                     uint64_t key) {
    int size = 4 >> code;
    if (exponent == no_exponent || exponent == nonfinite) {
        memset(dst, 0, (size_t)size * count);
        return 0;
    }
    double scale = ldexp(1.0, sbits - exponent);
    double lim = (double)(((int64_t)1 << ((32 >> code) - 1)) - 1);
    int64_t clipped = 0;
    for (int i = 0; i < count; i++) {
        double x = (double)v[i] * scale;
        clipped += fabs(x) > lim;
        x = x < -lim ? -lim : (x > lim ? lim : x);
        int64_t q;
        if (stochastic) {
            double u = (double)(mix64(key + (uint64_t)i * 0x9E3779B97F4A7C15ull) >> 11) *
                       0x1p-53;
            q = (int64_t)floor(x + u);
            q = q < -(int64_t)lim ? -(int64_t)lim : (q > (int64_t)lim ? (int64_t)lim : q);
        } else {
            q = (int64_t)rint(x);
        }
        uint8_t *o = dst + (size_t)size * i;
        if (size == 4) ina_put_be32(o, (uint32_t)q);
        else if (size == 2) { o[0] = (uint8_t)(q >> 8); o[1] = (uint8_t)q; }
        else o[0] = (uint8_t)q;
    }
    return clipped;
}

static void dequantw(const uint8_t *q, int nel, double factor, float *o, int code) {
    for (int i = 0; i < nel; i++) {
        int64_t v = code == 0 ? (int64_t)ina_be32(q + 4 * (size_t)i)
                  : code == 1 ? (int64_t)(int16_t)(((uint16_t)q[2 * i] << 8) | q[2 * i + 1])
                  : (int64_t)(int8_t)q[i];
        o[i] = (float)((double)v * factor);
    }
}

static void dequant(const uint8_t *q, int nel, double factor, float *o) {
#ifdef HAVE_AVX2_PATH
    if (avx2()) {
        int k;
        if (frexp(factor, &k) == 0.5 && k - 1 >= -126 && k - 1 <= 96)   /* 2^(k-1) */
            dequant_avx2f(q, nel, (float)factor, o);
        else
            dequant_avx2(q, nel, factor, o);
        return;
    }
#endif
    dequant_portable(q, nel, factor, o);
}

/* quantize.py's _exponents: per chunk the largest |bits| (an integer max that orders
 * finite magnitudes as the floats do, inf/NaN above them), frexp's exponent read off the
 * bits; the first chunk with inf or NaN, or -1 */
TARGETS
static uint32_t chunk_max(const uint32_t *restrict b, int64_t n) {
    uint32_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t a = b[i] & 0x7FFFFFFFu;
        m = a > m ? a : m;
    }
    return m;
}

static int64_t exponents(const uint32_t *bits, int64_t n, int E, int8_t *out, int64_t k,
                         int no_exponent) {
    int64_t bad = -1;
    for (int64_t j = 0; j < k; j++) {
        int64_t a = j * E, len = n - a < E ? n - a : E;
        uint32_t m = chunk_max(bits + a, len);
        int e;
        if (m == 0) {
            e = no_exponent;
        } else if (m >= 0x7F800000u) {
            e = 127;                     /* quantize.NONFINITE */
            if (bad < 0) bad = j;
        } else {
            int biased = m >> 23;
            if (biased) {
                e = biased - 126;
            } else {
                e = -149;
                while (m) { m >>= 1; e++; }
            }
            e = e < -127 ? -127 : (e > 126 ? 126 : e);
        }
        out[j] = (int8_t)e;
    }
    return bad;
}

/* the ack a DATA of packet ``p`` carries in ``count`` (switch_client.py's ack_of): the
 * worker has the RESULT of every packet below ``low`` (and of every earlier call's), so
 * of every seq up to seq - (p - low + 1); 0 (no claim) past 16 bits */
static inline uint16_t ack_of(int p, int low) {
    int d = p - low + 1;
    return d > 0 && d <= 0xFFFF ? (uint16_t)d : 0;
}

static size_t build(Call *c, int p, int retransmit, int low) {
    const InaLayout *L = &c->L;
    int slot = p % c->W;
    uint8_t *b = c->ring + (size_t)slot * c->stride;
    if (c->slot_p[slot] != p) {
        c->slot_p[slot] = p;
        int nel = 0;
        if (p >= c->W) {
            int j = p - c->W;
            nel = nelem_of(c, p);
            if (c->code || c->stochastic)
                c->stats[S_CLIPPED] += packw(c->x + (int64_t)j * c->E, nel,
                                             c->shared_exp[j], c->sbits, b + L->header,
                                             L->no_exponent, L->nonfinite, c->code,
                                             c->stochastic,
                                             chunk_key(c->seed, c->base + (uint32_t)p,
                                                       c->worker));
            else
                c->stats[S_CLIPPED] += pack(c->x + (int64_t)j * c->E, nel, c->shared_exp[j],
                                            c->sbits, b + L->header, L->no_exponent,
                                            L->nonfinite);
        }
        memset(b, 0, L->header);
        b[L->version] = L->v_version;
        b[L->type] = L->t_data;
        b[L->flags] = p == c->P - 1 ? L->f_last : 0;
        b[L->exponent] = (uint8_t)(p < c->K ? c->local_exp[p] : L->no_exponent);
        ina_wr16(b + L->job, c->job);
        b[L->worker] = c->worker;
        ina_wr32(b + L->seq, c->base + (uint32_t)p);
        ina_wr16(b + L->nelem, nel);
        b[L->width] = (uint8_t)(c->code | c->code << 4);
        ina_wr32(b + L->bitmap, 1u << c->worker);
        ina_wr64(b + L->session, c->session);
    }
    ina_wr16(b + L->count, ack_of(p, low));
    c->stats[S_SENT]++;
    if (retransmit) {
        b[L->flags] |= L->f_retransmit;
        c->stats[S_RETRANSMITS]++;
    }
    return L->header + (size_t)(4 >> c->code) * nelem_of(c, p);
}

/* the packet index of a RESULT of this call, or -1 (every field checked) */
static int result_index(const Call *c, const uint8_t *d, size_t n) {
    const InaLayout *L = &c->L;
    if (n < (size_t)L->header) return -1;
    uint32_t p = ina_rd32(d + L->seq) - c->base;
    int nel = ina_rd16(d + L->nelem), w = d[L->worker];
    if (d[L->type] != L->t_result || d[L->version] != L->v_version ||
            (int)ina_rd16(d + L->job) != c->job || p >= (uint32_t)c->P ||
            ina_rd64(d + L->session) != c->session ||
            nel != nelem_of(c, (int)p) || (size_t)(4 >> c->code) * nel != n - L->header ||
            d[L->width] != (uint8_t)(c->code | c->code << 4) ||
            (int)ina_rd16(d + L->count) > c->nworkers || (w != c->worker && w != L->group_worker))
        return -1;
    return (int)p;
}

/* whether ``d`` is a STALE answer saying this worker is behind the job: an ERROR (header
 * only; version, job, worker and session checked) to a DATA of this call or an earlier
 * one, whose figure (the job's position when it answered) is more than ``stale_after``
 * past this call's base (an answer from before a rejoin, which moved the base to the
 * job's position, is not): switch_client.AllreduceCall.stale_behind */
static int stale_behind(const Call *c, const uint8_t *d, size_t n) {
    const InaLayout *L = &c->L;
    if (n != (size_t)L->header || d[L->type] != L->t_error || d[L->version] != L->v_version ||
            (int)ina_rd16(d + L->count) != REFUSAL_STALE ||
            (int)ina_rd16(d + L->job) != c->job || d[L->worker] != c->worker ||
            ina_rd64(d + L->session) != c->session)
        return 0;
    uint32_t seq = ina_rd32(d + L->seq), ahead = ina_rd32(d + L->bitmap) - c->base;
    int ours = seq - c->base < (uint32_t)c->P || c->base - seq < 0x80000000u;
    return ours && ahead > c->stale_after && ahead < 0x80000000u;
}

/* the packet index of an ERROR answering a DATA of this call (header only; version, job,
 * worker, session and seq checked), or -1: switch_client.AllreduceCall.error_index */
static int error_index(const Call *c, const uint8_t *d, size_t n) {
    const InaLayout *L = &c->L;
    if (n != (size_t)L->header || d[L->type] != L->t_error) return -1;
    uint32_t p = ina_rd32(d + L->seq) - c->base;
    if (d[L->version] != L->v_version || (int)ina_rd16(d + L->job) != c->job ||
            d[L->worker] != c->worker || p >= (uint32_t)c->P ||
            ina_rd64(d + L->session) != c->session)
        return -1;
    return (int)p;
}

static void apply(Call *c, int p, const uint8_t *d) {
    const InaLayout *L = &c->L;
    uint8_t *held = c->heldbuf[p];
    if (held) d = held;
    int64_t *st = c->stats;
    st[S_RESULTS]++;
    int flags = d[L->flags], count = (int)ina_rd16(d + L->count), nel = ina_rd16(d + L->nelem);
    if (p < c->K) c->shared_exp[p] = (int8_t)d[L->exponent];
    if (flags & L->f_overflow) st[S_OVERFLOW]++;
    /* the first RESULT of p came re-served to this worker (unicast, RETRANSMIT) and its
       bitmap holds this worker's DATA: the group's RESULT was lost on the way here, not
       a late contribution answered (slot_deadline.py's lost-RESULT signal) */
    if ((flags & L->f_retransmit) && ((ina_rd32(d + L->bitmap) >> c->worker) & 1u))
        st[S_REFETCHED]++;
    int partial = (flags & L->f_partial) || count < c->nworkers;
    if (partial) {
        st[S_PARTIAL]++;
        st[S_LOST] += nel;
    }
    if (p >= c->W && nel) {
        float *o = c->out + (int64_t)(p - c->W) * c->E;
        int e = c->shared_exp[p - c->W];
        if (c->missed && partial && count &&
                !((ina_rd32(d + L->bitmap) >> c->worker) & 1u))
            c->missed[p - c->W] = 1;         /* carry: sent again with the next call */
        if (count == 0 || e == L->no_exponent) {
            memset(o, 0, nel * sizeof(float));
        } else if (e == L->nonfinite) {      /* some worker's chunk held inf or NaN */
            for (int i = 0; i < nel; i++) o[i] = NAN;
        } else {
            double factor = ldexp(partial && !c->missed ? (double)c->nworkers / count : 1.0,
                                  e - c->sbits);
            if (c->code) dequantw(d + L->header, nel, factor, o, c->code);
            else dequant(d + L->header, nel, factor, o);
        }
    }
    if (held) {
        free(held);
        c->heldbuf[p] = NULL;
    }
}

static void abandon(Call *c, int p) {
    c->stats[S_ABANDONED]++;
    if (p >= c->W) {
        int nel = nelem_of(c, p);
        c->stats[S_LOST] += nel;
        memset(c->out + (int64_t)(p - c->W) * c->E, 0, nel * sizeof(float));
    }
    if (p < c->K) c->shared_exp[p] = c->L.no_exponent;
}

/* ---- the socket loop ---------------------------------------------------------------- */
typedef struct {
    int fd, n;
    struct sockaddr_in to;
    struct mmsghdr msgs[SENDQ];
    struct iovec iov[SENDQ];
    int slot[SENDQ];
    int err;
    double pace;      /* seconds per wire byte (0: no pacing); SwitchClient.pace_rate */
    double next_tx;   /* pacing: the earliest time the next datagram may go */
    double *tsent;    /* pacing: the window's send times, set when a datagram really goes
                       * (its timer and RTT sample start then, not while it waits here) */
    int p[SENDQ];
    int refused;      /* sends this host's own queue refused since the loop last looked */
    int gso;          /* consecutive datagrams of one size go as one GSO send */
    struct mmsghdr gm[SENDQ];   /* send_range's sends: a run of datagrams each */
    int gfirst[SENDQ], gcount[SENDQ];
    GsoCtl gctl[SENDQ];
} SendQ;

static double mono(void);

/* The socket has IP_RECVERR (SwitchClient: a send the host's own queue drops fails with
 * ENOBUFS), so an ICMP error (a switch that is down) is also queued on its error queue,
 * where poll reports it until it is read: read them all, each time one is reported. */
static void drain_errors(int fd) {
    char buf[256], ctl[256];
    for (int i = 0; i < 4096; i++) {
        struct iovec iov = {buf, sizeof buf};
        struct msghdr m = {0};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl;
        m.msg_controllen = sizeof ctl;
        if (recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) break;
    }
}

/* Group datagrams from..from+count-1 into sends: with q->gso, in runs (ina_gso.h) of
 * at most GSO_MAX_SEGS. */
static int group_sends(SendQ *q, int from, int count) {
    int ng = 0, end = from + count;
    for (int i = from; i < end; ng++) {
        int k = q->gso ? gso_run(q->iov, NULL, i, end, GSO_MAX_SEGS) : 1;
        struct msghdr *h = &q->gm[ng].msg_hdr;
        memset(h, 0, sizeof *h);
        h->msg_name = &q->to;
        h->msg_namelen = sizeof q->to;
        h->msg_iov = &q->iov[i];
        h->msg_iovlen = k;
        if (k > 1) gso_mark(h, &q->gctl[ng], q->iov[i].iov_len);
        q->gfirst[ng] = i;
        q->gcount[ng] = k;
        i += k;
    }
    return ng;
}

static void send_range(SendQ *q, Call *c, int from, int count) {
    int g = 0, ng = group_sends(q, from, count), end = from + count, local = 0, waits = 0;
    while (g < ng) {
        int r = sendmmsg(q->fd, q->gm + g, ng - g, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            if ((errno == EAGAIN || errno == EWOULDBLOCK) && waits < LOCAL_WAITS) {
                /* a full send buffer: this worker's share of its host's queue
                 * (sockbuf.local_queue_bytes) is full; poll reports it writable once
                 * the queue has sent half of it */
                struct pollfd pf = {q->fd, POLLOUT, 0};
                poll(&pf, 1, LOCAL_WAIT_MS);
                waits++;
                c->stats[S_LOCAL_WAITS]++;
                continue;
            }
            if (errno == ENOBUFS && local < LOCAL_RETRIES) {
                /* the host's own queue (its qdisc) is full and dropped the datagram
                 * (told by IP_RECVERR): as TCP on local congestion, it goes again once
                 * the queue has drained a little, not after a timer */
                struct timespec ts = {0, LOCAL_RETRY_NS};
                nanosleep(&ts, NULL);
                local++;
                q->refused++;
                c->stats[S_LOCAL_RETRIES]++;
                continue;
            }
            if (gso_refused(errno) && q->gso && q->gcount[g] > 1) {
                /* this kernel or device cannot segment: one datagram per send from now */
                q->gso = 0;
                int rest = q->gfirst[g];
                send_range(q, c, rest, end - rest);
                end = rest;
                break;
            }
            if (errno == ECONNREFUSED) drain_errors(q->fd);
            else if (!q->err) q->err = errno;
            g++;                  /* those datagrams are lost; the timers recover them */
        } else {
            g += r;
            waits = 0;
        }
    }
    for (int i = from; i < end; i++) c->slot_pending[q->slot[i]] = 0;
}

/* Send the queued datagrams. Paced (q->pace > 0: SwitchClient.pace_rate), one goes
 * only once the link has sent the one before (the host's own tbf queue on a slow link
 * holds ~3 jumbo datagrams: a window sent at once overflowed it): ``block`` waits for
 * each; otherwise only those due now go, the rest stay queued for the loop, which
 * wakes for them (so RESULTs are read, and RTTs measured, while a window is paced). */
static void flush_paced(SendQ *q, Call *c, int block) {
    if (q->pace <= 0) {
        send_range(q, c, 0, q->n);
        q->n = 0;
        return;
    }
    int i = 0;
    while (i < q->n) {
        double now = mono();
        if (q->next_tx > now) {
            if (!block) break;
            double d = q->next_tx - now;
            struct timespec ts = {(time_t)d, (long)((d - (time_t)d) * 1e9)};
            while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
            now = q->next_tx;
        }
        send_range(q, c, i, 1);
        q->next_tx = now + (double)(q->iov[i].iov_len + UDP_IP_BYTES) * q->pace;
        if (q->tsent) q->tsent[q->p[i]] = now;
        i++;
    }
    if (i == 0) return;
    int rest = q->n - i;          /* keep the unsent, in order, at the front */
    for (int j = 0; j < rest; j++) {
        q->iov[j] = q->iov[i + j];
        q->msgs[j] = q->msgs[i + j];
        q->msgs[j].msg_hdr.msg_iov = &q->iov[j];
        q->slot[j] = q->slot[i + j];
        q->p[j] = q->p[i + j];
    }
    q->n = rest;
}

static void flush(SendQ *q, Call *c) {
    flush_paced(q, c, 1);
}

static void queue_send(SendQ *q, Call *c, int p, int retransmit, int low) {
    int slot = p % c->W;
    if (c->slot_pending[slot] && c->slot_p[slot] != p) flush(q, c);   /* slot is reused */
    if (q->n == SENDQ) flush(q, c);
    size_t len = build(c, p, retransmit, low);
    int i = q->n++;
    q->iov[i].iov_base = c->ring + (size_t)slot * c->stride;
    q->iov[i].iov_len = len;
    memset(&q->msgs[i].msg_hdr, 0, sizeof(struct msghdr));
    q->msgs[i].msg_hdr.msg_name = &q->to;
    q->msgs[i].msg_hdr.msg_namelen = sizeof q->to;
    q->msgs[i].msg_hdr.msg_iov = &q->iov[i];
    q->msgs[i].msg_hdr.msg_iovlen = 1;
    q->slot[i] = slot;
    q->p[i] = p;
    if (q->tsent) q->tsent[p] = INFINITY;    /* paced: its timer starts when it goes */
    c->slot_pending[slot] = 1;
}

/* perform the window's actions; ``d``: the RESULT datagram just received (or NULL) */
static int perform(Win *w, Call *c, SendQ *q, const uint8_t *d, size_t n) {
    for (int i = 0; i < w->nact; i++) {
        Action a = w->act[i];
        switch (a.kind) {
        case A_SEND: queue_send(q, c, a.p, a.flag, w->low); break;
        case A_DELIVER: apply(c, a.p, d); break;
        case A_ABANDON:           /* the result is gone for good: the call fails */
            abandon(c, a.p);
            w->nact = 0;
            return RC_TOO_LATE;
        case A_HOLD:
            if (!c->heldbuf[a.p]) {
                c->heldbuf[a.p] = malloc(n);
                if (!c->heldbuf[a.p]) return -ENOMEM;
                memcpy(c->heldbuf[a.p], d, n);
            }
            break;
        case A_FAIL:
            w->nact = 0;
            return a.p == FAIL_UNAVAILABLE ? RC_UNAVAILABLE : RC_STALLED;
        }
    }
    w->nact = 0;
    return RC_OK;
}

static double mono(void) {   /* (declared above, for pacing) */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    struct mmsghdr msgs[RBATCH];
    struct iovec iov[RBATCH];
    struct sockaddr_in from[RBATCH];
    uint8_t *buf;
} RecvQ;

/* A signal interrupted the wait: run Python's handlers now (the loop holds no GIL; it
 * takes it for this), so Ctrl-C raises KeyboardInterrupt in the call, not when the call
 * ends (for a stalled call, its timeout later). 1: a handler raised; its exception is
 * kept in ``c`` and raised by the call. Otherwise the wait goes on as before. */
static int signalled(Call *c) {
    PyGILState_STATE g = PyGILState_Ensure();
    int raised = PyErr_CheckSignals() < 0;
    if (raised) PyErr_Fetch(&c->exc_type, &c->exc_value, &c->exc_tb);
    PyGILState_Release(g);
    return raised;
}

static int loop(Win *w, Call *c, SendQ *q, RecvQ *rq, const int fds[2], int nfds,
                uint32_t sw_ip, uint16_t sw_port) {
    const InaLayout *L = &c->L;
    int r;
    win_start(w, mono());
    if ((r = perform(w, c, q, NULL, 0))) return r;
    flush_paced(q, c, 0);
    while (w->remaining) {
        int useful = 0;
        if (q->refused) {         /* the host's own queue refused sends: local congestion */
            win_local(w, mono());
            q->refused = 0;
        }
        if (q->n) flush_paced(q, c, 0);       /* paced datagrams now due */
        for (int s = 0; s < nfds && w->remaining; s++) {
            for (;;) {                    /* drain this socket */
                for (int i = 0; i < RBATCH; i++)
                    rq->msgs[i].msg_hdr.msg_namelen = sizeof(struct sockaddr_in);
                /* never more than the call still needs: a RESULT of the next call
                 * (bounded mode: its slot closed without us) stays for that call */
                int want = w->remaining < RBATCH ? w->remaining : RBATCH;
                int got = recvmmsg(fds[s], rq->msgs, want, MSG_DONTWAIT, NULL);
                if (got <= 0) {
                    if (got < 0 && errno == ECONNREFUSED) {   /* ICMP: switch down */
                        drain_errors(fds[s]);
                        continue;
                    }
                    break;
                }
                double now = mono();
                for (int i = 0; i < got; i++) {
                    const uint8_t *d = rq->iov[i].iov_base;
                    size_t n = rq->msgs[i].msg_len;
                    if (ntohl(rq->from[i].sin_addr.s_addr) != sw_ip ||
                            ntohs(rq->from[i].sin_port) != sw_port) {
                        c->stats[S_FOREIGN]++;        /* only the switch's RESULTs count */
                        continue;
                    }
                    if (n < (size_t)L->header) continue;
                    int p = result_index(c, d, n);
                    if (p < 0) {
                        int q = error_index(c, d, n);
                        /* a STALE answer ends the call whatever this worker has read:
                         * the RESULTs it missed may still wait in its socket, but its
                         * DATA go on being too late (its peers' results leave it out)
                         * until it rejoins. Before, it was dropped when its RESULT had
                         * been read first, or its call was over: whether a resumed
                         * rank rejoined or lagged on depended on the reading order.
                         * Where the ranks do not rejoin, stale_after is 0xFFFFFFFF: a
                         * bounded call reads what waits (a reliable one ends) */
                        if ((q >= 0 && ((int)ina_rd16(d + L->count) != REFUSAL_STALE ||
                                        !w->bounded)) ||
                                stale_behind(c, d, n)) {
                            c->refusal = (int)ina_rd16(d + L->count);
                            c->refusal_figure = ina_rd32(d + L->bitmap);
                            c->refused_p = q;
                            c->refused_seq = ina_rd32(d + L->seq);
                            return RC_REFUSED;
                        }
                        c->stats[S_FOREIGN]++;
                        continue;
                    }
                    if (!w->bounded && (d[L->flags] & L->f_partial)) return RC_INCONSISTENT;
                    if (!(d[L->flags] & L->f_partial) && (int)ina_rd16(d + L->count) != c->nworkers) {
                        c->refusal_figure = (int)ina_rd16(d + L->count);   /* the job's member count */
                        return RC_MEMBERS_DIFFER;
                    }
                    win_on_result(w, p, now, (d[L->flags] & L->f_congested) != 0);
                    if (w->nact) {
                        useful = 1;
                        if ((r = perform(w, c, q, d, n))) return r;
                    } else {
                        c->stats[S_DUPLICATES]++;
                    }
                }
                flush_paced(q, c, 0);
                if (got < want || !w->remaining) break;
            }
        }
        if (q->err) return -q->err;
        if (useful && w->remaining && !q->n) {
            /* read RESULTs in batches (window.py's COALESCE_*): wait a little while a
             * queue stands on the path, so the next read finds several */
            double d = win_coalesce(w);
            if (d > 0.0) {
                struct timespec cs = {0, (long)(d * 1e9)};
                c->stats[S_COALESCED]++;
                if (nanosleep(&cs, NULL) < 0 && errno == EINTR && signalled(c))
                    return RC_INTERRUPTED;
            }
        }
        if (useful || !w->remaining) continue;
        double now = mono(), t;
        win_on_timer(w, now);
        if (w->nact) {
            if ((r = perform(w, c, q, NULL, 0))) return r;
            flush_paced(q, c, 0);
            continue;
        }
        double wait = win_next_wakeup(w, &t) ? t - now : win_rto(w);
        if (q->n && q->next_tx - now < wait) wait = q->next_tx - now;
        if (wait < 0.0002) wait = 0.0002;
        if (!(wait < 1.0)) wait = 1.0;        /* never an infinite or NaN timespec */
        struct pollfd pf[2] = {{fds[0], POLLIN, 0}, {nfds > 1 ? fds[1] : -1, POLLIN, 0}};
        struct timespec ts = {(time_t)wait, (long)((wait - (time_t)wait) * 1e9)};
        if (ppoll(pf, nfds, &ts, NULL) < 0) {
            if (errno != EINTR) return -errno;
            if (signalled(c)) return RC_INTERRUPTED;
        } else if (pf[0].revents & POLLERR) {
            drain_errors(fds[0]);
        }
    }
    return RC_OK;
}

static int get_buf(PyObject *o, Py_buffer *b, int writable, Py_ssize_t itemsize,
                   const char *what) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (b->itemsize != itemsize) {
        PyBuffer_Release(b);
        PyErr_Format(PyExc_TypeError, "%s: items of %zd bytes expected", what, itemsize);
        return -1;
    }
    return 0;
}

/* run_call(layout, fds, switch_ip, switch_port, x, out, ring, local_exp, job, worker,
 *          nworkers, elements, base, window, cfg, rtt, stats, session) -> (code, remaining)
 * code: 0 done, 1 switch unavailable, 2 stalled, 3 PARTIAL in a reliable call,
 * 4 a result gone for good (bounded: too late), 5 the switch refused a DATA (an ERROR:
 * then reason, figure, the packet index (-1: a DATA of an earlier call) and the seq
 * follow the code and the remaining count; stale_after: see Call),
 * 6 a complete RESULT of another member count (figure: the count),
 * -errno: a socket error. rtt (float64[NRTT]: RttEstimator's fields) and stats (int64[10])
 * are updated in place. */
static PyObject *run_call(PyObject *self, PyObject *args) {
    PyObject *layout, *fdt, *ox, *oout, *oring, *oexp, *ocfg, *ortt, *ostats;
    PyObject *omissed = Py_None;  /* carry mode: uint8 per chunk, or None */
    unsigned long sw_ip, base;
    unsigned long long session;
    int sw_port, job, worker, nworkers, E, W;
    double pace_rate = 0.0;    /* bit/s on the worker's link; 0: no pacing */
    int bits = 32, stochastic = 0;
    unsigned long long seed = 0;
    unsigned long stale_after = 0;
    int gso = 1;               /* SwitchClient.gso */
    if (!PyArg_ParseTuple(args, "OOkiOOOOiiiikiOOOK|dOipKkp", &layout, &fdt, &sw_ip, &sw_port,
                          &ox, &oout, &oring, &oexp, &job, &worker, &nworkers, &E, &base,
                          &W, &ocfg, &ortt, &ostats, &session, &pace_rate, &omissed, &bits,
                          &stochastic, &seed, &stale_after, &gso))
        return NULL;
    if (bits != 32 && bits != 16 && bits != 8)
        return PyErr_Format(PyExc_ValueError, "run_call: width %d (32, 16 or 8)", bits);
    Call c;
    memset(&c, 0, sizeof c);
    if (ina_layout_from_dict(layout, &c.L) < 0) return NULL;
    int fds[2] = {-1, -1}, nfds;
    if (!PyArg_ParseTuple(fdt, "i|i", &fds[0], &fds[1])) return NULL;
    nfds = fds[1] >= 0 ? 2 : 1;
    double cfg[NCFG];
    if (!PyArg_ParseTuple(ocfg, "dddddddd", &cfg[0], &cfg[1], &cfg[2], &cfg[3], &cfg[4],
                          &cfg[5], &cfg[6], &cfg[7]))
        return NULL;
    Py_buffer bx, bout, bring, bexp, brtt, bst;
    if (get_buf(ox, &bx, 0, 4, "x") < 0) return NULL;
    if (get_buf(oout, &bout, 1, 4, "out") < 0) { PyBuffer_Release(&bx); return NULL; }
    if (get_buf(oring, &bring, 1, 1, "ring") < 0) goto e2;
    if (get_buf(oexp, &bexp, 0, 1, "local_exp") < 0) goto e3;
    if (get_buf(ortt, &brtt, 1, 8, "rtt") < 0) goto e4;
    if (get_buf(ostats, &bst, 1, 8, "stats") < 0) goto e5;
    Py_buffer bmiss = {0};
    int has_missed = omissed != Py_None;
    if (has_missed && get_buf(omissed, &bmiss, 1, 1, "missed") < 0) goto e6;
    int64_t n = bx.len / 4;
    c.x = bx.buf; c.out = bout.buf; c.n = n; c.E = E; c.W = W;
    c.K = (int)((n + E - 1) / E); c.P = c.K + W;
    c.job = job; c.worker = worker; c.nworkers = nworkers; c.base = (uint32_t)base;
    c.session = session;
    c.code = bits == 32 ? 0 : (bits == 16 ? 1 : 2);
    c.stochastic = stochastic;
    c.seed = seed;
    c.stale_after = (uint32_t)stale_after;
    c.sbits = bits - 2;
    for (int k = 1; k < nworkers; k *= 2) c.sbits--;   /* quantize.scale_bits */
    c.ring = bring.buf; c.stride = c.L.header + 4 * (size_t)E;
    c.local_exp = bexp.buf; c.stats = bst.buf;
    c.missed = has_missed ? bmiss.buf : NULL;
    PyObject *res = NULL;
    if (bout.len != bx.len || bring.len < (Py_ssize_t)(W * c.stride) || bexp.len < c.K ||
            brtt.len < NRTT * 8 || bst.len < NSTATS * 8 || (has_missed && bmiss.len < c.K)) {
        PyErr_SetString(PyExc_ValueError, "run_call: buffer sizes do not fit the call");
        goto e7;
    }
    c.slot_p = malloc(W * sizeof(int));
    c.slot_pending = calloc(W, 1);
    c.shared_exp = malloc((c.K ? c.K : 1) * sizeof(int16_t));
    c.heldbuf = calloc(c.P, sizeof(uint8_t *));
    SendQ *q = calloc(1, sizeof(SendQ));
    RecvQ *rq = calloc(1, sizeof(RecvQ));
    Win w;
    int wok = win_init(&w, c.P, W, cfg, brtt.buf);
    if (rq) rq->buf = malloc((size_t)RBATCH * RXBUF);
    if (!c.slot_p || !c.slot_pending || !c.shared_exp || !c.heldbuf || !q || !rq ||
            !rq->buf || wok < 0) {
        PyErr_NoMemory();
    } else {
        for (int i = 0; i < W; i++) c.slot_p[i] = -1;
        for (int i = 0; i < c.K; i++) c.shared_exp[i] = c.L.no_exponent;
        q->fd = fds[0];
        q->pace = pace_rate > 0 ? 8.0 / pace_rate : 0.0;
        q->gso = gso;
        q->tsent = q->pace > 0 ? w.tsent : NULL;
        q->to.sin_family = AF_INET;
        q->to.sin_port = htons(sw_port);
        q->to.sin_addr.s_addr = htonl(sw_ip);
        for (int i = 0; i < RBATCH; i++) {
            rq->iov[i].iov_base = rq->buf + (size_t)i * RXBUF;
            rq->iov[i].iov_len = RXBUF;
            rq->msgs[i].msg_hdr.msg_name = &rq->from[i];
            rq->msgs[i].msg_hdr.msg_iov = &rq->iov[i];
            rq->msgs[i].msg_hdr.msg_iovlen = 1;
        }
        int code;
        Py_BEGIN_ALLOW_THREADS
        code = loop(&w, &c, q, rq, fds, nfds, (uint32_t)sw_ip, (uint16_t)sw_port);
        if (code == RC_OK) flush(q, &c);
        Py_END_ALLOW_THREADS
        if (code == RC_INTERRUPTED)
            PyErr_Restore(c.exc_type, c.exc_value, c.exc_tb);
        else
            res = Py_BuildValue("(iiikik)", code, w.remaining, c.refusal,
                                (unsigned long)c.refusal_figure, c.refused_p,
                                (unsigned long)c.refused_seq);
    }
    win_free(&w);
    if (c.heldbuf)
        for (int p = 0; p < c.P; p++) free(c.heldbuf[p]);
    free(c.heldbuf); free(c.slot_p); free(c.slot_pending); free(c.shared_exp);
    if (rq) free(rq->buf);
    free(rq); free(q);
e7: if (has_missed) PyBuffer_Release(&bmiss);
e6: PyBuffer_Release(&bst);
e5: PyBuffer_Release(&brtt);
e4: PyBuffer_Release(&bexp);
e3: PyBuffer_Release(&bring);
e2: PyBuffer_Release(&bout);
    PyBuffer_Release(&bx);
    return res;
}

/* ---- Window: the same state machine, stepped from Python (for the tests) --------- */
typedef struct {
    PyObject_HEAD
    Win w;
    int ok;
    PyObject *rtt;          /* the float64[NRTT] buffer's owner */
    Py_buffer brtt;
} WindowObject;

static int Window_init(WindowObject *self, PyObject *args, PyObject *kw) {
    int P, W;
    PyObject *ocfg, *ortt;
    double cfg[NCFG];
    if (!PyArg_ParseTuple(args, "iiOO", &P, &W, &ocfg, &ortt)) return -1;
    if (!PyArg_ParseTuple(ocfg, "dddddddd", &cfg[0], &cfg[1], &cfg[2], &cfg[3], &cfg[4],
                          &cfg[5], &cfg[6], &cfg[7]))
        return -1;
    if (P < 1 || W < 1) {
        PyErr_Format(PyExc_ValueError, "%d packets, window %d: need >= 1 of each", P, W);
        return -1;
    }
    if (get_buf(ortt, &self->brtt, 1, 8, "rtt") < 0) return -1;
    if (self->brtt.len < NRTT * 8) {
        PyBuffer_Release(&self->brtt);
        PyErr_Format(PyExc_ValueError, "rtt: %d float64 needed", NRTT);
        return -1;
    }
    Py_INCREF(ortt);
    self->rtt = ortt;
    if (win_init(&self->w, P, W, cfg, self->brtt.buf) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    self->ok = 1;
    return 0;
}

static void Window_dealloc(WindowObject *self) {
    if (self->ok) win_free(&self->w);
    if (self->rtt) {
        PyBuffer_Release(&self->brtt);
        Py_DECREF(self->rtt);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *actions(Win *w) {
    PyObject *l = PyList_New(w->nact);
    for (int i = 0; l && i < w->nact; i++)
        PyList_SET_ITEM(l, i, Py_BuildValue("(iii)", w->act[i].kind, w->act[i].p,
                                            w->act[i].flag));
    w->nact = 0;
    return l;
}

static PyObject *Window_start(WindowObject *self, PyObject *args) {
    double now;
    if (!PyArg_ParseTuple(args, "d", &now)) return NULL;
    win_start(&self->w, now);
    return actions(&self->w);
}

static PyObject *Window_on_result(WindowObject *self, PyObject *args) {
    int p, congested = 0;
    double now;
    if (!PyArg_ParseTuple(args, "id|p", &p, &now, &congested)) return NULL;
    if (p < 0 || p >= self->w.P) return PyErr_Format(PyExc_IndexError, "packet %d", p);
    win_on_result(&self->w, p, now, congested);
    return actions(&self->w);
}

static PyObject *Window_on_timer(WindowObject *self, PyObject *args) {
    double now;
    if (!PyArg_ParseTuple(args, "d", &now)) return NULL;
    win_on_timer(&self->w, now);
    return actions(&self->w);
}

static PyObject *Window_on_local_congestion(WindowObject *self, PyObject *args) {
    double now;
    if (!PyArg_ParseTuple(args, "d", &now)) return NULL;
    win_local(&self->w, now);
    return actions(&self->w);
}

static PyObject *Window_next_wakeup(WindowObject *self, PyObject *noargs) {
    double t;
    if (!win_next_wakeup(&self->w, &t)) Py_RETURN_NONE;
    return PyFloat_FromDouble(t);
}

static PyObject *Window_coalesce(WindowObject *self, PyObject *noargs) {
    return PyFloat_FromDouble(win_coalesce(&self->w));
}

static PyObject *Window_rto(WindowObject *self, PyObject *noargs) {
    return PyFloat_FromDouble(win_rto(&self->w));
}

static PyObject *Window_timeout(WindowObject *self, PyObject *noargs) {
    return PyFloat_FromDouble(win_timeout(&self->w));
}

static PyObject *Window_state(WindowObject *self, PyObject *noargs) {
    return Py_BuildValue("(iiidi)", self->w.remaining, self->w.nfresh + self->w.nresent,
                         self->w.started, self->w.last_progress, win_limit(&self->w));
}

static PyMethodDef Window_methods[] = {
    {"start", (PyCFunction)Window_start, METH_VARARGS, "start(now) -> [(kind, p, flag)]"},
    {"on_result", (PyCFunction)Window_on_result, METH_VARARGS, "on_result(p, now)"},
    {"on_timer", (PyCFunction)Window_on_timer, METH_VARARGS, "on_timer(now)"},
    {"on_local_congestion", (PyCFunction)Window_on_local_congestion, METH_VARARGS,
     "on_local_congestion(now)"},
    {"next_wakeup", (PyCFunction)Window_next_wakeup, METH_NOARGS, "time or None"},
    {"rto", (PyCFunction)Window_rto, METH_NOARGS, "the retransmission timeout"},
    {"coalesce", (PyCFunction)Window_coalesce, METH_NOARGS,
     "seconds to wait before reading again"},
    {"timeout", (PyCFunction)Window_timeout, METH_NOARGS, "rto, or start_wait"},
    {"state", (PyCFunction)Window_state, METH_NOARGS,
     "(remaining, inflight, started, last_progress, limit)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WindowType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ina_fabric.host.transport._client.Window",
    .tp_basicsize = sizeof(WindowObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Window(P, W, cfg, rtt): SendWindow's rules in C (rtt: float64[10], shared)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Window_init,
    .tp_dealloc = (destructor)Window_dealloc,
    .tp_methods = Window_methods,
};

/* The two buffers of a kernel binding: ``a`` (read, items of ``ia`` bytes) and ``b``
 * (written, items of ``ib`` bytes); -1 with both released and an error set. */
static int get_pair(PyObject *oa, Py_buffer *a, Py_ssize_t ia, PyObject *ob, Py_buffer *b,
                    Py_ssize_t ib) {
    if (get_buf(oa, a, 0, ia, "input") < 0) return -1;
    if (get_buf(ob, b, 1, ib, "output") < 0) {
        PyBuffer_Release(a);
        return -1;
    }
    return 0;
}

/* release both, and the result: ``value`` unless an error was set */
static PyObject *end_pair(Py_buffer *a, Py_buffer *b, PyObject *value) {
    PyBuffer_Release(a);
    PyBuffer_Release(b);
    if (PyErr_Occurred()) {
        Py_XDECREF(value);
        return NULL;
    }
    return value;
}

/* exponents(x: float32, elements, out: int8) -> first chunk with inf/NaN or -1 */
static PyObject *py_exponents(PyObject *self, PyObject *args) {
    PyObject *ox, *oo;
    int E, noexp;
    if (!PyArg_ParseTuple(args, "OiOi", &ox, &E, &oo, &noexp)) return NULL;
    Py_buffer bx, bo;
    if (get_pair(ox, &bx, 4, oo, &bo, 1) < 0) return NULL;
    int64_t n = bx.len / 4, k = E > 0 ? (n + E - 1) / E : 0, bad = -1;
    if (E <= 0 || bo.len < k) {
        PyErr_SetString(PyExc_ValueError, "exponents: bad elements or out too short");
    } else {
        Py_BEGIN_ALLOW_THREADS
        bad = exponents(bx.buf, n, E, bo.buf, k, noexp);
        Py_END_ALLOW_THREADS
    }
    return end_pair(&bx, &bo, PyLong_FromLongLong(bad));
}

/* pack(x, start, count, exponent, sbits, out: uint8, offset, no_exponent, nonfinite)
 * -> clipped */
static PyObject *py_pack(PyObject *self, PyObject *args) {
    PyObject *ox, *oo;
    long long start, count, offset;
    int e, sbits, noexp, nonfin;
    if (!PyArg_ParseTuple(args, "OLLiiOLii", &ox, &start, &count, &e, &sbits, &oo, &offset,
                          &noexp, &nonfin))
        return NULL;
    Py_buffer bx, bo;
    if (get_pair(ox, &bx, 4, oo, &bo, 1) < 0) return NULL;
    int64_t r = 0;
    if (start < 0 || count < 0 || start + count > bx.len / 4 || offset < 0 || offset % 4 ||
            offset + 4 * count > bo.len || count > INT32_MAX)
        PyErr_SetString(PyExc_ValueError, "pack: out of range");
    else
        r = pack((const float *)bx.buf + start, (int)count, e, sbits,
                 (uint8_t *)bo.buf + offset, noexp, nonfin);
    return end_pair(&bx, &bo, PyLong_FromLongLong(r));
}

/* dequant(buf: uint8, offset, count, factor, out: float32, start) */
static PyObject *py_dequant(PyObject *self, PyObject *args) {
    PyObject *ob, *oo;
    long long offset, count, start;
    double factor;
    if (!PyArg_ParseTuple(args, "OLLdOL", &ob, &offset, &count, &factor, &oo, &start))
        return NULL;
    Py_buffer bb, bo;
    if (get_pair(ob, &bb, 1, oo, &bo, 4) < 0) return NULL;
    if (offset < 0 || count < 0 || offset + 4 * count > bb.len || start < 0 ||
            start + count > bo.len / 4 || count > INT32_MAX)
        PyErr_SetString(PyExc_ValueError, "dequant: out of range");
    else
        dequant((const uint8_t *)bb.buf + offset, (int)count, factor,
                (float *)bo.buf + start);
    return end_pair(&bb, &bo, Py_NewRef(Py_None));
}

/* packw(x, start, count, exponent, sbits, out: uint8, offset, no_exponent, nonfinite,
 *       bits, stochastic, key) -> clipped; dequantw(buf, offset, count, factor, out,
 * start, bits): quantize._packw / _dequantw compiled here (the differential tests) */
static PyObject *py_packw(PyObject *self, PyObject *args) {
    PyObject *ox, *oo;
    long long start, count, offset;
    int e, sbits, noexp, nonfin, bits, sr;
    unsigned long long key;
    if (!PyArg_ParseTuple(args, "OLLiiOLiiipK", &ox, &start, &count, &e, &sbits, &oo,
                          &offset, &noexp, &nonfin, &bits, &sr, &key))
        return NULL;
    int code = bits == 32 ? 0 : (bits == 16 ? 1 : (bits == 8 ? 2 : -1));
    if (code < 0) return PyErr_Format(PyExc_ValueError, "packw: width %d", bits);
    Py_buffer bx, bo;
    if (get_pair(ox, &bx, 4, oo, &bo, 1) < 0) return NULL;
    int64_t r = 0;
    if (start < 0 || count < 0 || start + count > bx.len / 4 || offset < 0 ||
            offset + (4 >> code) * count > bo.len || count > INT32_MAX)
        PyErr_SetString(PyExc_ValueError, "packw: out of range");
    else
        r = packw((const float *)bx.buf + start, (int)count, e, sbits,
                  (uint8_t *)bo.buf + offset, noexp, nonfin, code, sr, key);
    return end_pair(&bx, &bo, PyLong_FromLongLong(r));
}

static PyObject *py_dequantw(PyObject *self, PyObject *args) {
    PyObject *ob, *oo;
    long long offset, count, start;
    double factor;
    int bits;
    if (!PyArg_ParseTuple(args, "OLLdOLi", &ob, &offset, &count, &factor, &oo, &start, &bits))
        return NULL;
    int code = bits == 32 ? 0 : (bits == 16 ? 1 : (bits == 8 ? 2 : -1));
    if (code < 0) return PyErr_Format(PyExc_ValueError, "dequantw: width %d", bits);
    Py_buffer bb, bo;
    if (get_pair(ob, &bb, 1, oo, &bo, 4) < 0) return NULL;
    if (offset < 0 || count < 0 || offset + (4 >> code) * count > bb.len || start < 0 ||
            start + count > bo.len / 4 || count > INT32_MAX)
        PyErr_SetString(PyExc_ValueError, "dequantw: out of range");
    else
        dequantw((const uint8_t *)bb.buf + offset, (int)count, factor,
                 (float *)bo.buf + start, code);
    return end_pair(&bb, &bo, Py_NewRef(Py_None));
}

static PyObject *py_chunk_key(PyObject *self, PyObject *args) {
    unsigned long long seed;
    unsigned long seq;
    int worker;
    if (!PyArg_ParseTuple(args, "Kki", &seed, &seq, &worker)) return NULL;
    return PyLong_FromUnsignedLongLong(chunk_key(seed, (uint32_t)seq, worker));
}

static PyObject *py_set_avx2(PyObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    int was = avx2();
    use_avx2 = on ? (was || use_avx2 == 1) : 0;
#ifdef HAVE_AVX2_PATH
    if (on) use_avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
#endif
    return PyBool_FromLong(was);
}

static PyMethodDef module_methods[] = {
    {"run_call", run_call, METH_VARARGS, "one allreduce call (see the source)"},
    {"set_avx2", py_set_avx2, METH_VARARGS,
     "set_avx2(on) -> was: use the AVX2 element loops where the CPU has them (tests)"},
    {"exponents", py_exponents, METH_VARARGS, "quantize._exponents, compiled"},
    {"pack", py_pack, METH_VARARGS, "quantize._pack, compiled"},
    {"dequant", py_dequant, METH_VARARGS, "quantize._dequant, compiled"},
    {"packw", py_packw, METH_VARARGS, "quantize._packw, compiled"},
    {"dequantw", py_dequantw, METH_VARARGS, "quantize._dequantw, compiled"},
    {"chunk_key", py_chunk_key, METH_VARARGS, "quantize.chunk_key, compiled"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_client", "The worker's compiled allreduce call.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__client(void) {
    if (PyType_Ready(&WindowType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&WindowType);
    if (PyModule_AddObject(m, "Window", (PyObject *)&WindowType) < 0) {
        Py_DECREF(&WindowType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
