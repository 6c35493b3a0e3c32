"""The traffic manager's per-packet path in C, tested against testbed/switch/traffic_manager.py
(the reference): admission (each queue's static depth, or the shared buffer's dynamic
threshold), the per-port, per-priority FIFOs, strict priority, the port's rate (bits and
packets per second, the fraction of a nanosecond carried from one booking to the next), the
`delay` and `rate_factor` faults, pauses held by a downstream device, PFC's counting against
ingress ports with its static or dynamic thresholds and its timers, and what INT and the
latency monitor read (the queue found on arrival, the packets left, the waits).

The float arithmetic is the reference's, in double, in the same order of operations: each
departure books the same nanoseconds. What happens per pause frame or per PFC timer rather
than per packet runs the reference's Python on the C state (receiving a pause, refreshing
the pauses this switch holds, the watchdog's poll, turning PFC on or off, flushes): the C
says when a timer is due (`xm_tm_pfc_due`). A pause or resume the C decides is kept in
`pauses` and sent by the caller right after the call, before anything else happens, which is
when the reference sends it.

Ports free at the same time leave in port order, as in the reference. Which ports hold a
packet is kept in C (`busy`), the reference's set of busy ports a view of it here.

The C is generated into the build's source (`source()`), the structs declared once below for
both the C and cffi's cdef.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from typing import Any

from controller.wire.pfc import QUANTUM_BITS
from testbed.switch.drop_reports import DROP_REASONS, REPORT_GAP_BYTES
from testbed.switch.native.build import build, load
from testbed.switch.pfc import PfcConfig, PfcPortCounters, PfcQueueState, WatchdogConfig
from testbed.switch.traffic_manager import (
    MAX_DEPTH_PACKETS,
    MAX_PORT,
    MAX_SERVICE_NS,
    Clock,
    PortFault,
    PortQueues,
    SharedBuffer,
    TrafficManager,
)

TM_QUEUES = 8  # priorities a port may have (standard_metadata.priority: 3 bits)
REPORT_REASONS = tuple(DROP_REASONS.values())  # the drops reported, by index in C
RX_DRAWS = 64  # draws of the `loss` faults' generator taken into C at a time

# declared once: the C source and cffi's cdef both read these structs
_STRUCTS = """
typedef struct {{
    uint64_t handle; /* the caller's packet */
    uint64_t cpkt; /* its xm_packet (a native pipeline's packet), or 0 */
    int64_t nbytes;
    int64_t enq_ns;
    int64_t expected; /* what the bytes ahead take at the port's set rate */
    int64_t in_port; /* the ingress port PFC counts it against, or -1 */
}} xm_tm_item;

typedef struct {{ /* one (port, priority)'s PFC state: the reference's PfcQueueState, in part */
    int64_t exists; /* the reference's per_prio holds it: its order of making, from 1 */
    int64_t ingress_bytes;
    int64_t pausing;
    int64_t xoff_sent_ns;
    int64_t paused_until_ns;
    int64_t paused_since_set; /* paused_since_ns is not the reference's None */
    int64_t paused_since_ns;
    int64_t paused_ns;
    int64_t storm;
}} xm_pfc_state;

typedef struct {{ /* a pause (quanta > 0) or resume (0) C decided; the caller sends it */
    int64_t port;
    int64_t prio;
    int64_t quanta;
}} xm_pfc_pause;

typedef struct {{
    xm_tm_item *items; /* a ring of cap items (a power of two), len of them from head */
    int64_t cap;
    int64_t head;
    int64_t len;
}} xm_tm_fifo;

typedef struct {{
    int64_t exists;
    int64_t depth_pkts;
    int64_t depth_bytes;
    double rate_pps;
    double rate_bps;
    int64_t next_tx_ns;
    double tx_carry_ns;
    int64_t first_tx_ns;
    int64_t last_tx_end_ns;
    int64_t enqueued;
    int64_t dequeued;
    int64_t dropped;
    int64_t max_depth_pkts;
    int64_t max_depth_bytes;
    int64_t fault_down;
    int64_t fault_delay_ns;
    double fault_rate_factor;
    int64_t fault_silent;
    double fault_loss;
    int64_t rx_errors; /* frames a `loss` fault dropped, counted (the port's FCS errors) */
    int64_t silent_drops; /* ... and those a silent one dropped */
    int64_t departures;
    int64_t wait_ns;
    int64_t expected_wait_ns;
    int64_t qbytes[{nq}];
    int64_t pause_until[{nq}];
    int64_t dequeued_prio[{nq}];
    xm_tm_fifo queues[{nq}];
    xm_pfc_state pfc[{nq}];
}} xm_tm_port;

typedef struct {{
    int64_t nb_queues;
    int64_t default_depth_pkts;
    int64_t default_depth_bytes;
    double default_rate_pps;
    double default_rate_bps;
    int64_t buffer_bytes; /* 0: no shared buffer, each queue's static depth */
    double buffer_alpha;
    int64_t buffered_bytes;
    int64_t queued; /* packets in every queue */
    int64_t port_hi; /* one past the highest port made: what a scan of the ports covers */
    /* PFC (the reference's PfcConfig while pfc_on) and the watchdog's part C reads */
    int64_t pfc_on;
    int64_t pfc_xoff;
    int64_t pfc_xon;
    int64_t pfc_quanta;
    int64_t pfc_prios; /* the lossless priorities, a bit each */
    double pfc_link_bps;
    double pfc_alpha;
    int64_t pfc_pool;
    int64_t pfc_reserve;
    int64_t pfc_resume_offset;
    int64_t pfc_shared_used; /* the reference's _pfc_shared_used */
    int64_t pfc_made; /* PFC states made (their `exists`) */
    int64_t wd_drop; /* a watchdog with the action drop */
    int64_t wd_next_set; /* the reference's _wd_next_ns is not None */
    int64_t wd_next_ns;
    /* drop reports' pacing: when a drop of each (port, reason of REPORT_REASONS) was last
     * reported (report_set: one was), and the drops held back */
    int64_t report_ns[{nports}][{nreasons}];
    uint8_t report_set[{nports}][{nreasons}];
    int64_t reports_held;
    /* the next draws of the `loss` faults' generator (the reference's rng.random(), in its
     * order: Python fills them, C and Python take them) */
    double rx_draws[{ndraws}];
    int64_t rx_draws_next;
    int64_t rx_draws_left;
    int64_t npause; /* pauses decided and not yet sent (the caller sends them, in order) */
    int64_t pause_lost; /* more than pauses[] holds: never (at most one per (port, prio)) */
    xm_pfc_pause pauses[{npauses}];
    uint8_t busy[{nports}]; /* the port has a queued packet (the reference's _busy) */
    uint8_t rx_fault[{nports}]; /* the port is down or lossy (the reference's rx_faults) */
    xm_tm_port ports[{nports}];
}} xm_tm;

typedef struct {{
    int64_t port;
    int64_t prio;
    uint64_t handle;
    uint64_t cpkt;
    int64_t enq_ns;
    int64_t left; /* packets left in its queue */
    int64_t start; /* when it starts to leave */
}} xm_tm_departure;
"""

_FUNCS = """
int xm_tm_fifo_push(xm_tm_fifo *q, xm_tm_item item);
xm_tm_item xm_tm_fifo_pop(xm_tm_fifo *q);
xm_tm_port *xm_tm_port_of(xm_tm *tm, int64_t port);
int xm_tm_enqueue(xm_tm *tm, int64_t port, int64_t prio, uint64_t handle, uint64_t cpkt,
                  int64_t nbytes, int64_t now_ns, int64_t in_port, int64_t *found);
int64_t xm_tm_dequeue_ready(xm_tm *tm, int64_t now_ns, xm_tm_departure *out, int64_t cap);
int xm_tm_next_departure(xm_tm *tm, int64_t *t);
int xm_tm_pfc_due(const xm_tm *tm, int64_t now_ns);
int xm_tm_report_held(xm_tm *tm, int64_t port, int64_t reason, int64_t now_ns);
int xm_tm_corrupted(xm_tm *tm, int64_t port);
void xm_tm_resize(xm_tm *tm, int64_t port, int64_t booked, int64_t sent);
void xm_tm_free(xm_tm *tm);
"""

_C = r"""
#define XM_TM_NQ {nq}
#define XM_TM_PORTS {nports}
#define XM_MAX_SERVICE_NS {max_service}
#define XM_MAX_DEPTH_PACKETS {max_depth}
#define XM_TM_PAUSES {npauses}
#define XM_REPORT_QUEUE_FULL {report_queue_full} /* REPORT_REASONS' index of a full queue */

/* the port's queues, made with the defaults on first use (the reference's `port`) */
xm_tm_port *xm_tm_port_of(xm_tm *tm, int64_t port)
{{
    xm_tm_port *pq = &tm->ports[port];
    if (!pq->exists) {{
        memset(pq, 0, sizeof *pq);
        pq->exists = 1;
        pq->depth_pkts = tm->default_depth_pkts;
        pq->depth_bytes = tm->default_depth_bytes;
        pq->rate_pps = tm->default_rate_pps;
        pq->rate_bps = tm->default_rate_bps;
        pq->first_tx_ns = -1;
        pq->last_tx_end_ns = -1;
        pq->fault_rate_factor = 1.0;
        if (port >= tm->port_hi) tm->port_hi = port + 1;
    }}
    return pq;
}}

int xm_tm_fifo_push(xm_tm_fifo *q, xm_tm_item item)
{{
    if (q->len == q->cap) {{
        int64_t cap = q->cap ? 2 * q->cap : 16;
        xm_tm_item *items = malloc((size_t)cap * sizeof *items);
        if (!items) return -1;
        for (int64_t i = 0; i < q->len; i++) items[i] = q->items[(q->head + i) & (q->cap - 1)];
        free(q->items);
        q->items = items;
        q->cap = cap;
        q->head = 0;
    }}
    q->items[(q->head + q->len) & (q->cap - 1)] = item;
    q->len++;
    return 0;
}}

xm_tm_item xm_tm_fifo_pop(xm_tm_fifo *q)
{{
    xm_tm_item item = q->items[q->head];
    q->head = (q->head + 1) & (q->cap - 1);
    q->len--;
    return item;
}}

static int port_empty(const xm_tm *tm, const xm_tm_port *pq)
{{
    for (int64_t prio = 0; prio < tm->nb_queues; prio++)
        if (pq->queues[prio].len) return 0;
    return 1;
}}

/* PortQueues.service_ns: how long the port is busy sending nbytes at its rate */
static double service_ns(const xm_tm_port *pq, int64_t nbytes)
{{
    double t = 0.0;
    if (pq->rate_bps > 0) {{
        double x = (double)nbytes * 8e9 / pq->rate_bps;
        if (x > t) t = x;
    }}
    if (pq->rate_pps > 0) {{
        double x = 1e9 / pq->rate_pps;
        if (x > t) t = x;
    }}
    t = t / pq->fault_rate_factor;
    return t > XM_MAX_SERVICE_NS ? XM_MAX_SERVICE_NS : t;
}}

/* PortQueues.book_ns: whole nanoseconds of t, the fraction carried */
static int64_t book_ns(xm_tm_port *pq, double t)
{{
    double acc = pq->tx_carry_ns + t;
    double whole = __builtin_floor(acc);
    pq->tx_carry_ns = acc - whole;
    return (int64_t)whole;
}}

/* ---- PFC: TrafficManager's _count_in, _count_out, _paused_cum, _pfc_threshold, _pfc_timers */

static int64_t max0(int64_t x)
{{
    return x > 0 ? x : 0;
}}

/* a pause decided: the caller sends it (TrafficManager._send_pause), in the order decided */
static void send_pause(xm_tm *tm, int64_t port, int64_t prio, int64_t quanta)
{{
    if (tm->npause == XM_TM_PAUSES) {{
        tm->pause_lost++;
        return;
    }}
    xm_pfc_pause pause = {{port, prio, quanta}};
    tm->pauses[tm->npause++] = pause;
}}

/* the time the priority has been paused so far (a state never made has none) */
static int64_t paused_cum(const xm_pfc_state *st, int64_t now_ns)
{{
    if (!st->paused_since_set) return st->paused_ns;
    int64_t end = now_ns < st->paused_until_ns ? now_ns : st->paused_until_ns;
    return st->paused_ns + max0(end - st->paused_since_ns);
}}

/* the bytes above its reserve a (port, priority) may hold before it pauses */
static double pfc_threshold(const xm_tm *tm)
{{
    if (tm->pfc_alpha == 0.0) return (double)tm->pfc_xoff;
    return tm->pfc_alpha * (double)max0(tm->pfc_pool - tm->pfc_shared_used);
}}

/* PfcPortCounters.state: the (port, priority)'s state, made on first use */
static xm_pfc_state *pfc_state(xm_tm *tm, int64_t port, int64_t prio)
{{
    xm_pfc_state *st = &tm->ports[port].pfc[prio];
    if (!st->exists) st->exists = ++tm->pfc_made;
    return st;
}}

static void count_in(xm_tm *tm, int64_t port, int64_t prio, int64_t nbytes, int64_t now_ns)
{{
    xm_pfc_state *st = pfc_state(tm, port, prio);
    int64_t before = max0(st->ingress_bytes - tm->pfc_reserve);
    st->ingress_bytes += nbytes;
    int64_t shared = max0(st->ingress_bytes - tm->pfc_reserve);
    tm->pfc_shared_used += shared - before;
    if (!st->pausing && (double)shared >= pfc_threshold(tm)) {{
        st->pausing = 1;
        st->xoff_sent_ns = now_ns;
        send_pause(tm, port, prio, tm->pfc_quanta);
    }}
}}

/* what a packet counted against its ingress port releases, PFC on or off */
static void count_out(xm_tm *tm, int64_t port, int64_t prio, int64_t nbytes)
{{
    xm_pfc_state *st = pfc_state(tm, port, prio);
    int64_t reserve = tm->pfc_on ? tm->pfc_reserve : 0;
    int64_t before = max0(st->ingress_bytes - reserve);
    st->ingress_bytes -= nbytes;
    int64_t shared = max0(st->ingress_bytes - reserve);
    tm->pfc_shared_used += shared - before;
    if (!st->pausing || !tm->pfc_on) return;
    int resume = tm->pfc_alpha == 0.0
                     ? st->ingress_bytes <= tm->pfc_xon
                     : shared == 0 ||
                           (double)(shared + tm->pfc_resume_offset) <= pfc_threshold(tm);
    if (resume) {{
        st->pausing = 0;
        send_pause(tm, port, prio, 0);
    }}
}}

/* TrafficManager._refresh_ns: half a pause's time at the port's rate (controller/wire/pfc.py's
 * pause_ns, its rate rounded half to even as Python's round) */
static int64_t refresh_ns(const xm_tm *tm, const xm_tm_port *pq)
{{
    double rate = pq->rate_bps * pq->fault_rate_factor;
    if (rate == 0.0) rate = tm->pfc_link_bps;
    int64_t whole = (int64_t)__builtin_rint(rate);
    if (!(rate > 0.0) || whole <= 0) return (int64_t)1 << 62;
    int64_t half = tm->pfc_quanta * {quantum_bits} * 1000000000 / whole / 2;
    return half > 1 ? half : 1;
}}

/* the earliest of PFC's timers (a pause to refresh, the watchdog's poll): 1 and *t, or 0 */
static int pfc_timer(const xm_tm *tm, int64_t *t)
{{
    int have = 0;
    for (int64_t port = 0; port < tm->port_hi; port++) {{
        const xm_tm_port *pq = &tm->ports[port];
        if (!pq->exists) continue;
        for (int64_t prio = 0; prio < XM_TM_NQ; prio++) {{
            if (!pq->pfc[prio].pausing) continue;
            int64_t r = pq->pfc[prio].xoff_sent_ns + refresh_ns(tm, pq);
            if (!have || r < *t) *t = r;
            have = 1;
        }}
    }}
    if (tm->wd_next_set && (!have || tm->wd_next_ns < *t)) {{
        *t = tm->wd_next_ns;
        have = 1;
    }}
    return have;
}}

/* whether TrafficManager.pfc_tick has something to do at now_ns */
int xm_tm_pfc_due(const xm_tm *tm, int64_t now_ns)
{{
    int64_t t;
    return tm->pfc_on && pfc_timer(tm, &t) && t <= now_ns;
}}

/* TrafficManager.enqueue: 1 and the queue found (packets, bytes); 0 when full; 2 when the PFC
 * watchdog drops the queue's packets (the caller counts it); 3 when the ingress port PFC
 * would count it against is not made yet (the caller makes it and calls again); -1 out of
 * memory */
int xm_tm_enqueue(xm_tm *tm, int64_t port, int64_t prio, uint64_t handle, uint64_t cpkt,
                  int64_t nbytes, int64_t now_ns, int64_t in_port, int64_t *found)
{{
    xm_tm_port *pq = xm_tm_port_of(tm, port);
    xm_tm_fifo *q = &pq->queues[prio];
    int64_t n = q->len, b = pq->qbytes[prio];
    int lossless = tm->pfc_on && (tm->pfc_prios >> prio & 1);
    if (tm->pfc_on && pq->pfc[prio].exists && pq->pfc[prio].storm && tm->wd_drop) return 2;
    int full;
    if (!tm->buffer_bytes) {{
        full = n >= pq->depth_pkts || (pq->depth_bytes && b + nbytes > pq->depth_bytes);
    }} else {{
        int64_t used = tm->buffered_bytes + nbytes;
        full = used > tm->buffer_bytes || n >= XM_MAX_DEPTH_PACKETS;
        if (!full && !lossless)
            full = (double)(b + nbytes) >
                   tm->buffer_alpha * (double)(tm->buffer_bytes - tm->buffered_bytes);
    }}
    if (full) {{
        pq->dropped++;
        return 0;
    }}
    if (!lossless || in_port < 0) in_port = -1;
    if (in_port >= 0 && !tm->ports[in_port].exists) return 3; /* nothing changed yet */
    int64_t expected = 0;
    if (tm->busy[port] && pq->next_tx_ns > now_ns) expected = pq->next_tx_ns - now_ns;
    if (pq->rate_bps > 0) {{
        double rate = pq->fault_silent ? pq->rate_bps * pq->fault_rate_factor : pq->rate_bps;
        expected += (int64_t)((double)b * 8e9 / rate);
    }}
    /* the latency monitor: time this priority is paused while the packet waits is explained */
    if (tm->pfc_on) expected -= paused_cum(&pq->pfc[prio], now_ns);
    xm_tm_item item = {{handle, cpkt, nbytes, now_ns, expected, in_port}};
    if (xm_tm_fifo_push(q, item)) return -1;
    if (in_port >= 0) count_in(tm, in_port, prio, nbytes, now_ns);
    pq->qbytes[prio] = b + nbytes;
    tm->buffered_bytes += nbytes;
    tm->queued++;
    pq->enqueued++;
    if (n >= pq->max_depth_pkts) pq->max_depth_pkts = n + 1;
    if (b + nbytes > pq->max_depth_bytes) pq->max_depth_bytes = b + nbytes;
    tm->busy[port] = 1;
    found[0] = n;
    found[1] = b;
    return 1;
}}

/* one departure from the port's queue prio, booking the port (dequeue_ready's inner step) */
static xm_tm_departure depart(xm_tm *tm, int64_t port, xm_tm_port *pq, int64_t prio)
{{
    xm_tm_fifo *q = &pq->queues[prio];
    xm_tm_item it = xm_tm_fifo_pop(q);
    int64_t delay = pq->fault_delay_ns;
    pq->qbytes[prio] -= it.nbytes;
    tm->buffered_bytes -= it.nbytes;
    tm->queued--;
    pq->dequeued++;
    pq->dequeued_prio[prio]++;
    if (it.in_port >= 0) count_out(tm, it.in_port, prio, it.nbytes);
    /* busy from when the port became free (or the packet came, or its pause ended) */
    int64_t ready = it.enq_ns + delay;
    if (pq->pause_until[prio] > ready) ready = pq->pause_until[prio];
    int64_t start = pq->next_tx_ns > ready ? pq->next_tx_ns : ready;
    int64_t done = start;
    if (pq->rate_bps != 0 && pq->rate_pps == 0) {{
        double t = (double)it.nbytes * 8e9 / (pq->rate_bps * pq->fault_rate_factor);
        double acc = pq->tx_carry_ns + (t < XM_MAX_SERVICE_NS ? t : XM_MAX_SERVICE_NS);
        int64_t whole = (int64_t)acc;
        pq->tx_carry_ns = acc - (double)whole;
        done += whole;
    }} else if (pq->rate_pps != 0) {{
        done += book_ns(pq, service_ns(pq, it.nbytes));
    }}
    pq->next_tx_ns = done;
    if (pq->first_tx_ns < 0) pq->first_tx_ns = start;
    pq->last_tx_end_ns = done;
    pq->departures++;
    pq->wait_ns += start - it.enq_ns;
    if (tm->pfc_on) it.expected = max0(it.expected + paused_cum(&pq->pfc[prio], start));
    pq->expected_wait_ns += it.expected;
    xm_tm_departure d = {{port, prio, it.handle, it.cpkt, it.enq_ns, q->len, start}};
    return d;
}}

/* TrafficManager.dequeue_ready: rounds of one departure per free port, the ports of a round
 * in order of next_tx_ns, ties in port order; stops before a round that might not fit in cap
 * (calling again goes on where it stopped) */
int64_t xm_tm_dequeue_ready(xm_tm *tm, int64_t now_ns, xm_tm_departure *out, int64_t cap)
{{
    int64_t ports[XM_TM_PORTS];
    int64_t nout = 0;
    for (;;) {{
        /* the busy ports free by now, in port order: the reference passes over the others,
         * so only these need its order (sorting every busy port of a 128-port switch, for
         * the one or two that are free, was a tenth of a large fabric's time) */
        int64_t n = 0;
        for (int64_t port = 0; port < tm->port_hi; port++)
            if (tm->busy[port] && tm->ports[port].next_tx_ns <= now_ns) ports[n++] = port;
        if (n == 0 || n > cap - nout) break;
        for (int64_t i = 1; i < n; i++) {{ /* stable, as sorted() */
            int64_t p = ports[i], key = tm->ports[p].next_tx_ns, j = i;
            while (j > 0 && tm->ports[ports[j - 1]].next_tx_ns > key) {{
                ports[j] = ports[j - 1];
                j--;
            }}
            ports[j] = p;
        }}
        int progressed = 0;
        for (int64_t i = 0; i < n; i++) {{
            int64_t port = ports[i];
            xm_tm_port *pq = &tm->ports[port];
            int64_t delay = pq->fault_delay_ns;
            for (int64_t prio = tm->nb_queues - 1; prio >= 0; prio--) {{ /* strict priority */
                xm_tm_fifo *q = &pq->queues[prio];
                if (!q->len) continue;
                if (pq->pause_until[prio] > now_ns) continue; /* paused: the next one */
                if (delay && q->items[q->head].enq_ns + delay > now_ns) break; /* the port waits */
                out[nout++] = depart(tm, port, pq, prio);
                progressed = 1;
                break;
            }}
            if (port_empty(tm, pq)) tm->busy[port] = 0;
        }}
        if (!progressed) break;
    }}
    return nout;
}}

/* PortQueues.head_ready_ns */
static int64_t head_ready_ns(const xm_tm *tm, const xm_tm_port *pq)
{{
    int64_t t = pq->next_tx_ns, delay = pq->fault_delay_ns, pause = pq->pause_until[0];
    for (int64_t prio = 1; prio < tm->nb_queues; prio++)
        if (pq->pause_until[prio] > pause) pause = pq->pause_until[prio];
    if (!delay && pause <= t) return t;
    int have = 0;
    int64_t best = 0;
    for (int64_t prio = tm->nb_queues - 1; prio >= 0; prio--) {{
        const xm_tm_fifo *q = &pq->queues[prio];
        if (!q->len) continue;
        int64_t head = delay ? q->items[q->head].enq_ns + delay : 0;
        int64_t r = t;
        if (pq->pause_until[prio] > r) r = pq->pause_until[prio];
        if (head > r) r = head;
        if (!have || r < best) best = r;
        have = 1;
        if (delay) break; /* a delayed head holds the port */
    }}
    return have ? best : t;
}}

/* TrafficManager.next_departure_ns: 1 and *t, or 0 when nothing is queued and PFC has no
 * timer */
int xm_tm_next_departure(xm_tm *tm, int64_t *t)
{{
    int have = 0;
    if (tm->pfc_on) have = pfc_timer(tm, t);
    for (int64_t port = 0; port < tm->port_hi; port++) {{
        if (!tm->busy[port]) continue;
        int64_t r = head_ready_ns(tm, &tm->ports[port]);
        if (!have || r < *t) *t = r;
        have = 1;
    }}
    return have;
}}

/* TrafficManager.report_held, the reason by its index in REPORT_REASONS */
int xm_tm_report_held(xm_tm *tm, int64_t port, int64_t reason, int64_t now_ns)
{{
    if (!tm->report_set[port][reason]) return 0;
    const xm_tm_port *pq = &tm->ports[port];
    double rate = pq->exists && pq->rate_bps > 0 ? pq->rate_bps : 0.0;
    int64_t gap = rate != 0.0 ? (int64_t)({gap_bytes} * 8e9 / rate) : 1000000;
    if (now_ns - tm->report_ns[port][reason] >= gap) return 0;
    tm->reports_held++;
    return 1;
}}

/* TrafficManager.corrupted for a port with a `loss` fault: 1 (dropped, counted) or 0 from
 * the next draw; -1 when no draw is left (the caller asks Python, which fills them) */
int xm_tm_corrupted(xm_tm *tm, int64_t port)
{{
    xm_tm_port *pq = &tm->ports[port];
    if (!pq->exists || pq->fault_loss == 0.0) return 0;
    if (!tm->rx_draws_left) return -1;
    double u = tm->rx_draws[tm->rx_draws_next++];
    tm->rx_draws_left--;
    if (u >= pq->fault_loss) return 0;
    if (pq->fault_silent)
        pq->silent_drops++;
    else
        pq->rx_errors++;
    return 1;
}}

/* PortQueues.resize: the frame booked at `booked` bytes left as `sent` */
void xm_tm_resize(xm_tm *tm, int64_t port, int64_t booked, int64_t sent)
{{
    xm_tm_port *pq = xm_tm_port_of(tm, port);
    double extra;
    if (pq->rate_pps != 0 || pq->rate_bps == 0) {{
        if (pq->rate_pps == 0) return;
        extra = service_ns(pq, sent) - service_ns(pq, booked);
    }} else {{
        extra = (double)(sent - booked) * 8e9 / (pq->rate_bps * pq->fault_rate_factor);
    }}
    double acc = pq->tx_carry_ns + extra;
    double whole = __builtin_floor(acc);
    pq->tx_carry_ns = acc - whole;
    pq->next_tx_ns += (int64_t)whole;
    pq->last_tx_end_ns = pq->next_tx_ns;
}}

void xm_tm_free(xm_tm *tm)
{{
    for (int64_t port = 0; port < XM_TM_PORTS; port++)
        for (int64_t prio = 0; prio < XM_TM_NQ; prio++) {{
            xm_tm_fifo *q = &tm->ports[port].queues[prio];
            for (int64_t i = 0; i < q->len; i++) {{ /* a packet C holds (a native loop's) */
                xm_tm_item *it = &q->items[(q->head + i) & (q->cap - 1)];
                if (!it->handle) free((void *)(uintptr_t)it->cpkt);
            }}
            free(tm->ports[port].queues[prio].items);
            tm->ports[port].queues[prio].items = NULL;
        }}
}}
"""


def _fill(text: str) -> str:
    return text.format(
        nq=TM_QUEUES,
        nports=MAX_PORT + 1,
        max_service=f"{float(MAX_SERVICE_NS)!r}",
        max_depth=MAX_DEPTH_PACKETS,
        npauses=(MAX_PORT + 1) * TM_QUEUES,
        ndraws=RX_DRAWS,
        nreasons=len(REPORT_REASONS),
        report_queue_full=REPORT_REASONS.index(DROP_REASONS["queue_full"]),
        gap_bytes=REPORT_GAP_BYTES,
        quantum_bits=QUANTUM_BITS,
    )


def source() -> str:
    """The traffic manager's C (its structs, then its functions)."""
    return "\n".join(
        [
            "/* ---- the traffic manager (testbed/switch/native/tm.py) ---- */",
            "#include <stdint.h>",
            "#include <stdlib.h>",
            "#include <string.h>",
            _fill(_STRUCTS),
            _fill(_C),
        ]
    )


def cdef() -> str:
    return _fill(_STRUCTS) + _FUNCS


_LOADED: tuple[Any, Any] | None = None


def _loaded() -> tuple[Any, Any]:
    """(ffi, lib) of the traffic manager's C, built and loaded once per process."""
    global _LOADED
    if _LOADED is None:
        src = source()
        so = build(src, hashlib.sha256(src.encode()).hexdigest())
        _LOADED = load(cdef(), so)
    return _LOADED


def _cfield(name: str) -> property:
    """A field of the object's C struct (`_c`), read and written as the reference's."""

    def get(self: Any) -> Any:
        return getattr(self._c, name)

    def put(self: Any, value: Any) -> None:
        setattr(self._c, name, value)

    return property(get, put)


def _cflag(name: str) -> property:
    """A C int field read and written as the reference's bool."""

    def get(self: Any) -> bool:
        return bool(getattr(self._c, name))

    def put(self: Any, value: bool) -> None:
        setattr(self._c, name, int(value))

    return property(get, put)


class _Array:
    """A per-priority C array (qbytes, pause_until, dequeued_prio) as the reference's list."""

    __slots__ = ("_a", "_n")

    def __init__(self, a: Any, n: int) -> None:
        self._a, self._n = a, n

    def _index(self, i: int) -> int:
        if not -self._n <= i < self._n:
            raise IndexError("priority out of range")
        return i % self._n

    def __getitem__(self, i: int) -> int:
        return int(self._a[self._index(i)])

    def __setitem__(self, i: int, value: int) -> None:
        self._a[self._index(i)] = value

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[int]:
        return (int(self._a[i]) for i in range(self._n))

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (list, _Array)) else NotImplemented

    def __repr__(self) -> str:
        return repr(list(self))


class _Queue:
    """One C FIFO as the reference's deque of (packet, bytes, enqueue time, expected wait,
    ingress port), for the reference's code (flushes) run on the C state."""

    __slots__ = ("_tm", "_q")

    def __init__(self, tm: NativeTrafficManager, fifo: Any) -> None:
        self._tm, self._q = tm, fifo

    def __len__(self) -> int:
        return int(self._q.len)

    def __bool__(self) -> bool:
        return bool(self._q.len)

    def __getitem__(self, i: int) -> tuple[Any, int, int, int, int]:
        q = self._q
        if not -q.len <= i < q.len:
            raise IndexError("deque index out of range")
        it = q.items[(q.head + i % q.len) & (q.cap - 1)]
        h = it.handle or self._tm._adopt(it)
        return (self._tm.packets[h], it.nbytes, it.enq_ns, it.expected, it.in_port)

    def __iter__(self) -> Iterator[tuple[Any, int, int, int, int]]:
        return (self[i] for i in range(len(self)))

    def popleft(self) -> tuple[Any, int, int, int, int]:
        if not self._q.len:
            raise IndexError("pop from an empty deque")
        tm = self._tm
        if not self._q.items[self._q.head].handle:
            tm._adopt(self._q.items[self._q.head])
        it = tm.lib.xm_tm_fifo_pop(self._q)
        tm._c.queued -= 1
        return (tm.packets.pop(it.handle), it.nbytes, it.enq_ns, it.expected, it.in_port)

    def clear(self) -> None:
        while self._q.len:
            self.popleft()


class _PortFlags:
    """A set of ports of the reference (its busy ports, those holding a packet; its ports
    with a receive fault) as a view of a C array of flags, which the C reads (and for busy
    ports keeps); iterated in port order."""

    __slots__ = ("_c", "_flags")

    def __init__(self, c: Any, name: str) -> None:
        self._c = c
        self._flags = getattr(c, name)

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and 0 <= port <= MAX_PORT and bool(self._flags[port])

    def add(self, port: int) -> None:
        self._flags[port] = 1

    def discard(self, port: int) -> None:
        if 0 <= port <= MAX_PORT:
            self._flags[port] = 0

    def __iter__(self) -> Iterator[int]:
        flags = self._flags
        return iter([p for p in range(self._c.port_hi) if flags[p]])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __bool__(self) -> bool:
        return any(True for _ in self)


class _PfcPausing:
    """The reference's set of (ingress port, priority) this switch holds paused, as a view of
    the C states' `pausing` flags; iterated in (port, priority) order."""

    __slots__ = ("_tm",)

    def __init__(self, tm: NativeTrafficManager) -> None:
        self._tm = tm

    def _state(self, key: tuple[int, int]) -> Any:
        port, prio = key
        return self._tm._c.ports[port].pfc[prio]

    def __contains__(self, key: object) -> bool:
        return key in set(self)

    def add(self, key: tuple[int, int]) -> None:
        self._state(key).pausing = 1

    def discard(self, key: tuple[int, int]) -> None:
        self._state(key).pausing = 0

    def clear(self) -> None:
        for key in list(self):
            self.discard(key)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        c = self._tm._c
        return iter(
            [
                (port, prio)
                for port in range(c.port_hi)
                if c.ports[port].exists
                for prio in range(TM_QUEUES)
                if c.ports[port].pfc[prio].pausing
            ]
        )

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __bool__(self) -> bool:
        return any(True for _ in self)


def _csince(self: Any) -> int | None:
    return int(self._c.paused_since_ns) if self._c.paused_since_set else None


def _put_since(self: Any, value: int | None) -> None:
    self._c.paused_since_set = int(value is not None)
    self._c.paused_since_ns = 0 if value is None else value


class NativePfcQueueState(PfcQueueState):
    """One (port, priority)'s PFC state: what the per-packet path reads and writes in C, the
    watchdog's bookkeeping (per poll) here."""

    def __init__(self, c: Any) -> None:  # noqa: D107 - the dataclass's fields, in C and here
        self._c = c
        self.last_pause_rx_ns = None
        self.dequeued = 0
        self.wd_seen_dequeued = 0
        self.wd_stalled_polls = 0
        self.wd_quiet_polls = 0
        self.wd_seen_pause_rx = 0

    ingress_bytes = _cfield("ingress_bytes")  # type: ignore[assignment]
    pausing = _cflag("pausing")  # type: ignore[assignment]
    xoff_sent_ns = _cfield("xoff_sent_ns")  # type: ignore[assignment]
    paused_until_ns = _cfield("paused_until_ns")  # type: ignore[assignment]
    paused_since_ns = property(_csince, _put_since)  # type: ignore[assignment]
    paused_ns = _cfield("paused_ns")  # type: ignore[assignment]
    storm = _cflag("storm")  # type: ignore[assignment]


class NativePfcPortCounters(PfcPortCounters):
    """A port's PFC counters (Python's: they change per pause frame) and its per-priority
    states, those the reference would have made (`exists` in C) in `per_prio`."""

    def __init__(self, tm: NativeTrafficManager, c: Any) -> None:  # noqa: D107
        self._tm, self._c = tm, c
        self._states: dict[int, NativePfcQueueState] = {}
        self.xoff_sent = self.xon_sent = self.pauses_received = self.resumes_received = 0
        self.storms = self.restored = self.watchdog_drops = 0

    def _view(self, prio: int) -> NativePfcQueueState:
        st = self._states.get(prio)
        if st is None:
            st = self._states[prio] = NativePfcQueueState(self._c.pfc + prio)
        return st

    @property
    def per_prio(self) -> dict[int, PfcQueueState]:  # type: ignore[override]
        """The states made, in the order they were (as the reference's dict)."""
        pfc = self._c.pfc
        made = sorted((pfc[p].exists, p) for p in range(TM_QUEUES) if pfc[p].exists)
        return {p: self._view(p) for _, p in made}

    def state(self, prio: int) -> PfcQueueState:
        if not 0 <= prio < TM_QUEUES:
            raise ValueError(f"PFC priority {prio} is not within [0, {TM_QUEUES - 1}]")
        if not self._c.pfc[prio].exists:
            self._tm._c.pfc_made += 1
            self._c.pfc[prio].exists = self._tm._c.pfc_made
        return self._view(prio)


class _Draws(random.Random):
    """The `loss` faults' generator (the reference's `random.Random(0)`), whose draws C
    holds some of ahead: seeding it (the twin seeds each switch's) drops them."""

    def __init__(self, c: Any) -> None:
        self._c = c
        super().__init__(0)

    def seed(self, *args: Any, **kwargs: Any) -> None:
        super().seed(*args, **kwargs)
        self._c.rx_draws_left = 0

    def setstate(self, state: Any) -> None:
        super().setstate(state)
        self._c.rx_draws_left = 0


class NativePortFault(PortFault):
    """A port's fault: what the data path reads (delay, rate factor, silent) in C."""

    def __init__(self, c: Any) -> None:  # noqa: D107 - the dataclass's fields, in C
        self._c = c

    down = _cflag("fault_down")  # type: ignore[assignment]
    loss = _cfield("fault_loss")  # type: ignore[assignment]
    delay_ns = _cfield("fault_delay_ns")  # type: ignore[assignment]
    rate_factor = _cfield("fault_rate_factor")  # type: ignore[assignment]

    silent = _cflag("fault_silent")  # type: ignore[assignment]

    @property
    def healthy(self) -> bool:
        return (self.down, self.loss, self.delay_ns, self.rate_factor, self.silent) == (
            False,
            0.0,
            0,
            1.0,
            False,
        )


class NativePortQueues(PortQueues):
    """A port's queues whose state is the C traffic manager's (the reference's fields and
    methods, read and written there)."""

    def __init__(self, tm: NativeTrafficManager, port: int) -> None:  # noqa: D107
        c = tm.lib.xm_tm_port_of(tm._c, port)
        self._c = c
        self._tm = tm
        n = tm.nb_queues
        self.port = port
        self.nb_queues = n
        self.queues = [_Queue(tm, c.queues + i) for i in range(n)]  # type: ignore[misc]
        self.qbytes = _Array(c.qbytes, n)  # type: ignore[assignment]
        self.pause_until = _Array(c.pause_until, n)  # type: ignore[assignment]
        self.dequeued_prio = _Array(c.dequeued_prio, n)  # type: ignore[assignment]
        self.fault = NativePortFault(c)
        self.fault_drops = 0
        self.pfc = NativePfcPortCounters(tm, c)

    depth_pkts = _cfield("depth_pkts")  # type: ignore[assignment]
    depth_bytes = _cfield("depth_bytes")  # type: ignore[assignment]
    rate_pps = _cfield("rate_pps")  # type: ignore[assignment]
    rate_bps = _cfield("rate_bps")  # type: ignore[assignment]
    next_tx_ns = _cfield("next_tx_ns")  # type: ignore[assignment]
    tx_carry_ns = _cfield("tx_carry_ns")  # type: ignore[assignment]
    first_tx_ns = _cfield("first_tx_ns")  # type: ignore[assignment]
    last_tx_end_ns = _cfield("last_tx_end_ns")  # type: ignore[assignment]
    enqueued = _cfield("enqueued")  # type: ignore[assignment]
    dequeued = _cfield("dequeued")  # type: ignore[assignment]
    dropped = _cfield("dropped")  # type: ignore[assignment]
    max_depth_pkts = _cfield("max_depth_pkts")  # type: ignore[assignment]
    max_depth_bytes = _cfield("max_depth_bytes")  # type: ignore[assignment]
    departures = _cfield("departures")  # type: ignore[assignment]
    wait_ns = _cfield("wait_ns")  # type: ignore[assignment]
    expected_wait_ns = _cfield("expected_wait_ns")  # type: ignore[assignment]
    rx_errors = _cfield("rx_errors")  # type: ignore[assignment]
    silent_drops = _cfield("silent_drops")  # type: ignore[assignment]

    def resize(self, booked_bytes: int, sent_bytes: int) -> None:
        self._tm.lib.xm_tm_resize(self._tm._c, self.port, booked_bytes, sent_bytes)


class NativeTrafficManager(TrafficManager):
    """The traffic manager with its queues, port and PFC state in C: the per-packet methods
    (enqueue, dequeue_ready, next_departure_ns) run in C, the reference's others unchanged on
    that state (configuration, receiving a pause, PFC's timers and watchdog, flushes).
    Packets are held in `packets` by the integer handles the C queues carry."""

    def __init__(self, clock: Clock, nb_queues: int = 1, depth_pkts: int = 64):
        if not 1 <= nb_queues <= TM_QUEUES:
            raise ValueError(f"the native traffic manager has 1 to {TM_QUEUES} queues a port")
        self.ffi, self.lib = _loaded()
        self._mem = self.ffi.new("xm_tm *")
        self._c = self._mem
        self._c.nb_queues = nb_queues
        self.packets: dict[int, Any] = {}
        self._handle = 0
        self._found = self.ffi.new("int64_t[2]")
        self._t = self.ffi.new("int64_t *")
        self._out = self.ffi.new("xm_tm_departure[]", 64)
        self._out_cap = 64
        self._out_addr: tuple[Any, int] = (None, 0)
        # the C state's address (the pipeline's xm_receive_enqueue and xm_depart_batch)
        self.address = int(self.ffi.cast("uintptr_t", self._c))
        self._buffer: SharedBuffer | None = None
        # a native loop's switch hop queues packets C holds (handle 0, testbed/switch/native/
        # hop.py): what makes one Python's when the reference's code reads its queue
        self.adopt: Callable[[int], Any] | None = None
        self._pfc: PfcConfig | None = None
        self._watchdog: WatchdogConfig | None = None
        super().__init__(clock, nb_queues, depth_pkts)
        self.rng = _Draws(self._c)
        self._busy = _PortFlags(self._c, "busy")  # type: ignore[assignment]
        self.rx_faults = _PortFlags(self._c, "rx_fault")  # type: ignore[assignment]
        self._pausing = _PfcPausing(self)  # type: ignore[assignment]

    def __del__(self) -> None:
        lib = getattr(self, "lib", None)
        if lib is not None:
            lib.xm_tm_free(self._c)

    default_depth_pkts = _cfield("default_depth_pkts")  # type: ignore[assignment]
    default_depth_bytes = _cfield("default_depth_bytes")  # type: ignore[assignment]
    default_rate_pps = _cfield("default_rate_pps")  # type: ignore[assignment]
    default_rate_bps = _cfield("default_rate_bps")  # type: ignore[assignment]
    buffered_bytes = _cfield("buffered_bytes")  # type: ignore[assignment]
    _pfc_shared_used = _cfield("pfc_shared_used")
    reports_held = _cfield("reports_held")

    def _draw(self) -> float:
        """The next of the draws C holds, filled from `rng` when none is left (so the C and
        this take the generator's values in its order)."""
        c = self._c
        if not c.rx_draws_left:
            for i in range(RX_DRAWS):
                c.rx_draws[i] = self.rng.random()
            c.rx_draws_next, c.rx_draws_left = 0, RX_DRAWS
        u = float(c.rx_draws[c.rx_draws_next])
        c.rx_draws_next += 1
        c.rx_draws_left -= 1
        return u

    def report_held(self, port: int, reason: int, now_ns: int) -> bool:
        i = REPORT_REASONS.index(reason)
        return bool(self.lib.xm_tm_report_held(self._c, port, i, now_ns))

    def drop_reported(self, port: int, reason: int, now_ns: int) -> None:
        i = REPORT_REASONS.index(reason)
        self._c.report_ns[port][i] = now_ns
        self._c.report_set[port][i] = 1

    @property  # type: ignore[override]
    def pfc(self) -> PfcConfig | None:
        return self._pfc

    @pfc.setter
    def pfc(self, value: PfcConfig | None) -> None:
        self._pfc = value
        c = self._c
        c.pfc_on = value is not None
        if value is not None:
            c.pfc_xoff, c.pfc_xon, c.pfc_quanta = value.xoff_bytes, value.xon_bytes, value.quanta
            c.pfc_prios = sum(1 << p for p in value.priorities)
            c.pfc_link_bps, c.pfc_alpha = value.link_bps, value.alpha
            c.pfc_pool, c.pfc_reserve = value.pool_bytes, value.reserve_bytes
            c.pfc_resume_offset = value.resume_offset_bytes

    @property  # type: ignore[override]
    def watchdog(self) -> WatchdogConfig | None:
        return self._watchdog

    @watchdog.setter
    def watchdog(self, value: WatchdogConfig | None) -> None:
        self._watchdog = value
        self._c.wd_drop = value is not None and value.action == "drop"

    @property
    def _wd_next_ns(self) -> int | None:  # type: ignore[override]
        return int(self._c.wd_next_ns) if self._c.wd_next_set else None

    @_wd_next_ns.setter
    def _wd_next_ns(self, value: int | None) -> None:
        self._c.wd_next_set = value is not None
        self._c.wd_next_ns = 0 if value is None else value

    @property  # type: ignore[override]
    def buffer(self) -> SharedBuffer | None:
        return self._buffer

    @buffer.setter
    def buffer(self, value: SharedBuffer | None) -> None:
        self._buffer = value
        self._c.buffer_bytes = 0 if value is None else value.bytes
        self._c.buffer_alpha = 0.0 if value is None else value.alpha

    def _register(self, pkt: Any) -> int:
        """A new handle for the packet (`packets` holds it while it is queued)."""
        self._handle += 1
        h = self._handle
        self.packets[h] = pkt
        return h

    def _adopt(self, item: Any) -> int:
        """A queued item whose packet C holds, registered (`packets`) under a new handle,
        which the item then carries; the handle."""
        assert self.adopt is not None, "a packet held in C, and no one to adopt it"
        h = self._register(self.adopt(int(item.cpkt)))
        item.handle = h
        return h

    def take(self, d: Any) -> Any:
        """The packet of departure `d`, Python's from now on: `packets` let it go, or the
        native loop's C held it."""
        if d.handle:
            return self.packets.pop(d.handle)
        assert self.adopt is not None, "a packet held in C, and no one to adopt it"
        return self.adopt(int(d.cpkt))

    @staticmethod
    def cpkt(pkt: Any) -> int:
        """A native pipeline's packet's C address (xm_depart_batch runs its egress), else 0."""
        c = getattr(pkt, "_c", None)
        return 0 if c is None else int(pkt._rt.ffi.cast("uintptr_t", c))

    def dequeue_native(self, now_ns: int) -> int:
        """dequeue_ready into `departures` (C structs, the packets still in `packets`): how
        many, the resumes it decided sent."""
        cap = int(self._c.queued)
        if not cap:
            return 0
        if cap > self._out_cap:
            self._out_cap = max(cap, 2 * self._out_cap)
            self._out = self.ffi.new("xm_tm_departure[]", self._out_cap)
        n = int(self.lib.xm_tm_dequeue_ready(self._c, now_ns, self._out, cap))
        self.send_pauses()
        return n

    def ports_busy(self) -> bool:
        return bool(self._c.queued)

    @property
    def departures(self) -> Any:
        return self._out

    @property
    def departures_address(self) -> int:
        if self._out_addr[0] is not self._out:
            self._out_addr = (self._out, int(self.ffi.cast("uintptr_t", self._out)))
        return self._out_addr[1]

    def port(self, port: int) -> PortQueues:
        pq = self.ports.get(port)
        if pq is None:
            pq = NativePortQueues(self, port)
            self.ports[port] = pq
        return pq

    def enqueue(
        self, port: int, prio: int, pkt: Any, nbytes: int, now_ns: int, ingress_port: int = -1
    ) -> tuple[int, int] | None:
        if port not in self.ports:
            self.port(port)
        h = self._register(pkt)
        cpkt = self.cpkt(pkt)
        c, found = self._c, self._found
        rc = self.lib.xm_tm_enqueue(c, port, prio, h, cpkt, nbytes, now_ns, ingress_port, found)
        if rc == 3:  # PFC counts it against a port not made yet: made as the reference does
            self.port(ingress_port)
            rc = self.lib.xm_tm_enqueue(c, port, prio, h, cpkt, nbytes, now_ns, ingress_port, found)
        self.send_pauses()
        if rc == 1:
            return int(found[0]), int(found[1])
        del self.packets[h]
        if rc < 0:
            raise MemoryError("the native traffic manager could not grow a queue")
        self._refused(port, rc)
        return None

    def _refused(self, port: int, rc: int) -> None:
        """What the reference does when it refuses a packet the C refused (`rc`)."""
        if rc == 2:
            self.ports[port].pfc.watchdog_drops += 1
            self.last_drop = "pfc_watchdog"
        else:
            self.last_drop = "queue_full"

    def send_pauses(self) -> None:
        """Send the pauses and resumes the C decided, in order (the reference's _send_pause):
        after every C call that may decide one, before anything else happens."""
        c = self._c
        if not c.npause:
            return
        assert not c.pause_lost, "the native traffic manager lost a pause"
        pauses = [(p.port, p.prio, p.quanta) for p in c.pauses[0 : c.npause]]
        c.npause = 0
        for port, prio, quanta in pauses:
            self._send_pause(port, prio, quanta)

    def dequeue_ready(self, now_ns: int) -> list[tuple[int, int, Any, int, int, int]]:
        n = self.dequeue_native(now_ns)
        out = self._out
        res = []
        for i in range(n):
            d = out[i]
            res.append((d.port, d.prio, self.take(d), d.enq_ns, d.left, d.start))
        return res

    def next_departure_ns(self) -> int | None:
        return int(self._t[0]) if self.lib.xm_tm_next_departure(self._c, self._t) else None

    def pfc_tick(self, now_ns: int) -> None:
        if self.lib.xm_tm_pfc_due(self._c, now_ns):
            super().pfc_tick(now_ns)
