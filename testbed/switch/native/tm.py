"""The traffic manager's per-packet path in C, tested against testbed/switch/traffic_manager.py
(the reference): admission (each queue's static depth, or the shared buffer's dynamic
threshold), the per-port, per-priority FIFOs, strict priority, the port's rate (bits and
packets per second, the fraction of a nanosecond carried from one booking to the next), the
`delay` and `rate_factor` faults, pauses held by a downstream device, and what INT and the
latency monitor read (the queue found on arrival, the packets left, the waits).

The float arithmetic is the reference's, in double, in the same order of operations: each
departure books the same nanoseconds. What this cut does not do, the reference keeps: PFC's
counting against ingress ports (pauses sent, the watchdog), so a switch with PFC on runs the
Python traffic manager.

Ties between ports free at the same time are broken as the reference breaks them: in the
iteration order of its Python set of busy ports, which the caller passes in (`order`), a
Python set kept beside the C state (`NativeTrafficManager.busy`), added to on every enqueue
and discarded from when a port empties.

The C is generated into the build's source (`source()`), the structs declared once below for
both the C and cffi's cdef.
"""

from __future__ import annotations

from typing import Any

from testbed.switch.native.build import build, load
from testbed.switch.traffic_manager import (
    MAX_DEPTH_PACKETS,
    MAX_PORT,
    MAX_SERVICE_NS,
    SharedBuffer,
    check_fault_setting,
    check_queue_setting,
)

TM_QUEUES = 8  # priorities a port may have (standard_metadata.priority: 3 bits)

# declared once: the C source and cffi's cdef both read these structs
_STRUCTS = """
typedef struct {{
    uint64_t handle; /* the caller's packet */
    int64_t nbytes;
    int64_t enq_ns;
    int64_t expected; /* what the bytes ahead take at the port's set rate */
}} xm_tm_item;

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
    int64_t fault_delay_ns;
    double fault_rate_factor;
    int64_t fault_silent;
    int64_t departures;
    int64_t wait_ns;
    int64_t expected_wait_ns;
    int64_t qbytes[{nq}];
    int64_t pause_until[{nq}];
    int64_t dequeued_prio[{nq}];
    xm_tm_fifo queues[{nq}];
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
    uint8_t busy[{nports}]; /* the port has a queued packet (the reference's _busy) */
    xm_tm_port ports[{nports}];
}} xm_tm;

typedef struct {{
    int64_t port;
    int64_t prio;
    uint64_t handle;
    int64_t enq_ns;
    int64_t left; /* packets left in its queue */
    int64_t start; /* when it starts to leave */
}} xm_tm_departure;
"""

_FUNCS = """
xm_tm_port *xm_tm_port_of(xm_tm *tm, int64_t port);
int xm_tm_enqueue(xm_tm *tm, int64_t port, int64_t prio, uint64_t handle, int64_t nbytes,
                  int64_t now_ns, int64_t *found);
int64_t xm_tm_dequeue_ready(xm_tm *tm, int64_t now_ns, const int64_t *order, int64_t norder,
                            xm_tm_departure *out, int64_t cap);
int xm_tm_next_departure(xm_tm *tm, int64_t *t);
void xm_tm_resize(xm_tm *tm, int64_t port, int64_t booked, int64_t sent);
int64_t xm_tm_flush(xm_tm *tm, int64_t port, int64_t prio, uint64_t *handles);
void xm_tm_free(xm_tm *tm);
"""

_C = r"""
#define XM_TM_NQ {nq}
#define XM_TM_PORTS {nports}
#define XM_MAX_SERVICE_NS {max_service}
#define XM_MAX_DEPTH_PACKETS {max_depth}

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
    }}
    return pq;
}}

static int fifo_push(xm_tm_fifo *q, xm_tm_item item)
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

static xm_tm_item fifo_pop(xm_tm_fifo *q)
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

/* TrafficManager.enqueue with PFC off: 1 and the queue found (packets, bytes), or 0 when full */
int xm_tm_enqueue(xm_tm *tm, int64_t port, int64_t prio, uint64_t handle, int64_t nbytes,
                  int64_t now_ns, int64_t *found)
{{
    xm_tm_port *pq = xm_tm_port_of(tm, port);
    xm_tm_fifo *q = &pq->queues[prio];
    int64_t n = q->len, b = pq->qbytes[prio];
    int full;
    if (!tm->buffer_bytes) {{
        full = n >= pq->depth_pkts || (pq->depth_bytes && b + nbytes > pq->depth_bytes);
    }} else {{
        int64_t used = tm->buffered_bytes + nbytes;
        full = used > tm->buffer_bytes || n >= XM_MAX_DEPTH_PACKETS;
        if (!full)
            full = (double)(b + nbytes) >
                   tm->buffer_alpha * (double)(tm->buffer_bytes - tm->buffered_bytes);
    }}
    if (full) {{
        pq->dropped++;
        return 0;
    }}
    int64_t expected = 0;
    if (tm->busy[port] && pq->next_tx_ns > now_ns) expected = pq->next_tx_ns - now_ns;
    if (pq->rate_bps > 0) {{
        double rate = pq->fault_silent ? pq->rate_bps * pq->fault_rate_factor : pq->rate_bps;
        expected += (int64_t)((double)b * 8e9 / rate);
    }}
    xm_tm_item item = {{handle, nbytes, now_ns, expected}};
    if (fifo_push(q, item)) return -1;
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
    xm_tm_item it = fifo_pop(q);
    int64_t delay = pq->fault_delay_ns;
    pq->qbytes[prio] -= it.nbytes;
    tm->buffered_bytes -= it.nbytes;
    tm->queued--;
    pq->dequeued++;
    pq->dequeued_prio[prio]++;
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
    pq->expected_wait_ns += it.expected;
    xm_tm_departure d = {{port, prio, it.handle, it.enq_ns, q->len, start}};
    return d;
}}

/* TrafficManager.dequeue_ready: rounds of one departure per free port, the ports of a round
 * in order of next_tx_ns, ties in `order` (the busy set's iteration order); stops before a
 * round that might not fit in cap (calling again goes on where it stopped) */
int64_t xm_tm_dequeue_ready(xm_tm *tm, int64_t now_ns, const int64_t *order, int64_t norder,
                            xm_tm_departure *out, int64_t cap)
{{
    int64_t ports[XM_TM_PORTS];
    int64_t nout = 0;
    for (;;) {{
        int64_t n = 0;
        for (int64_t k = 0; k < norder; k++)
            if (tm->busy[order[k]]) ports[n++] = order[k];
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
            if (pq->next_tx_ns > now_ns) continue;
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

/* TrafficManager.next_departure_ns with PFC off: 1 and *t, or 0 when nothing is queued */
int xm_tm_next_departure(xm_tm *tm, int64_t *t)
{{
    int have = 0;
    for (int64_t port = 0; port < XM_TM_PORTS; port++) {{
        if (!tm->busy[port]) continue;
        int64_t r = head_ready_ns(tm, &tm->ports[port]);
        if (!have || r < *t) *t = r;
        have = 1;
    }}
    return have;
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

/* TrafficManager._flush with PFC off: every packet of one queue dropped, their handles out */
int64_t xm_tm_flush(xm_tm *tm, int64_t port, int64_t prio, uint64_t *handles)
{{
    xm_tm_port *pq = xm_tm_port_of(tm, port);
    xm_tm_fifo *q = &pq->queues[prio];
    int64_t n = q->len;
    for (int64_t i = 0; i < n; i++) handles[i] = fifo_pop(q).handle;
    tm->buffered_bytes -= pq->qbytes[prio];
    tm->queued -= n;
    pq->qbytes[prio] = 0;
    if (port_empty(tm, pq)) tm->busy[port] = 0;
    return n;
}}

void xm_tm_free(xm_tm *tm)
{{
    for (int64_t port = 0; port < XM_TM_PORTS; port++)
        for (int64_t prio = 0; prio < XM_TM_NQ; prio++) {{
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


class NativeTrafficManager:
    """The C traffic manager with PFC off, driven as TrafficManager is (same arguments, same
    results), packets passed as integer handles; `busy` is the reference's set of busy ports
    kept beside it for the order of ties."""

    def __init__(self, nb_queues: int = 1, depth_pkts: int = 64):
        if not 1 <= nb_queues <= TM_QUEUES:
            raise ValueError(f"the native traffic manager has 1 to {TM_QUEUES} queues a port")
        import hashlib

        src = source()
        so = build(src, hashlib.sha256(src.encode()).hexdigest())
        self.ffi, self.lib = load(cdef(), so)
        self._mem = self.ffi.new("xm_tm *")
        self.tm = self._mem
        self.tm.nb_queues = nb_queues
        self.tm.default_depth_pkts = depth_pkts
        self.nb_queues = nb_queues
        self.busy: set[int] = set()
        self.ports_seen: dict[int, None] = {}  # the reference's `ports` dict, in its order
        self._found = self.ffi.new("int64_t[2]")
        self._t = self.ffi.new("int64_t *")

    def __del__(self) -> None:
        lib = getattr(self, "lib", None)
        if lib is not None:
            lib.xm_tm_free(self.tm)

    def port(self, port: int) -> Any:
        self.ports_seen.setdefault(port, None)
        return self.lib.xm_tm_port_of(self.tm, port)

    # ---- configuration (the reference's, on the C state) -----------------------------------

    def _targets(self, port: int | None) -> list[Any]:
        if port is None:
            return [self.tm.ports[p] for p in self.ports_seen]
        return [self.port(port)]

    def set_depth(
        self, port: int | None, pkts: int | None = None, nbytes: int | None = None
    ) -> None:
        check_queue_setting(port, depth_pkts=pkts, depth_bytes=nbytes)
        for pq in self._targets(port):
            if pkts is not None:
                pq.depth_pkts = pkts
            if nbytes is not None:
                pq.depth_bytes = nbytes
        if port is None:
            if pkts is not None:
                self.tm.default_depth_pkts = pkts
            if nbytes is not None:
                self.tm.default_depth_bytes = nbytes

    def set_rate(
        self, port: int | None, now: int, pps: float | None = None, bps: float | None = None
    ) -> None:
        check_queue_setting(port, pps=pps, bps=bps)
        for pq in self._targets(port):
            if pps is not None:
                pq.rate_pps = pps
            if bps is not None:
                pq.rate_bps = bps
            pq.next_tx_ns = min(pq.next_tx_ns, now)
        if port is None:
            if pps is not None:
                self.tm.default_rate_pps = pps
            if bps is not None:
                self.tm.default_rate_bps = bps

    def set_fault(
        self,
        port: int,
        now: int,
        delay_ns: int | None = None,
        rate_factor: float | None = None,
        silent: bool | None = None,
    ) -> None:
        check_fault_setting(port, None, delay_ns, rate_factor)
        pq = self.port(port)
        if delay_ns is not None:
            pq.fault_delay_ns = delay_ns
        if silent is not None:
            pq.fault_silent = int(silent)
        if rate_factor is not None:
            pq.fault_rate_factor = rate_factor
            pq.next_tx_ns = min(pq.next_tx_ns, now)

    def set_buffer(self, buffer: SharedBuffer | None) -> None:
        self.tm.buffer_bytes = 0 if buffer is None else buffer.bytes
        self.tm.buffer_alpha = 0.0 if buffer is None else buffer.alpha

    def hold(self, port: int, prio: int, until_ns: int) -> None:
        """A downstream pause holds the priority until then (the reference's _set_pause)."""
        self.port(port).pause_until[prio] = until_ns

    # ---- the data path ---------------------------------------------------------------------

    def enqueue(
        self, port: int, prio: int, handle: int, nbytes: int, now_ns: int
    ) -> tuple[int, int] | None:
        self.ports_seen.setdefault(port, None)
        rc = self.lib.xm_tm_enqueue(self.tm, port, prio, handle, nbytes, now_ns, self._found)
        if rc < 0:
            raise MemoryError("the native traffic manager could not grow a queue")
        if not rc:
            return None
        self.busy.add(port)
        return int(self._found[0]), int(self._found[1])

    def dequeue_ready(self, now_ns: int) -> list[tuple[int, int, int, int, int, int]]:
        order = list(self.busy)
        if not order:
            return []
        cap = int(self.tm.queued)
        out = self.ffi.new("xm_tm_departure[]", max(1, cap))
        n = self.lib.xm_tm_dequeue_ready(self.tm, now_ns, order, len(order), out, cap)
        busy = self.tm.busy
        for port in order:
            if not busy[port]:
                self.busy.discard(port)
        return [
            (d.port, d.prio, d.handle, d.enq_ns, d.left, d.start)
            for d in (out[i] for i in range(n))
        ]

    def next_departure_ns(self) -> int | None:
        return int(self._t[0]) if self.lib.xm_tm_next_departure(self.tm, self._t) else None

    def resize(self, port: int, booked: int, sent: int) -> None:
        self.lib.xm_tm_resize(self.tm, port, booked, sent)

    def flush(self, port: int, prio: int) -> list[int]:
        pq = self.port(port)
        handles = self.ffi.new("uint64_t[]", max(1, pq.queues[prio].len))
        n = self.lib.xm_tm_flush(self.tm, port, prio, handles)
        if not self.tm.busy[port]:
            self.busy.discard(port)
        return [int(handles[i]) for i in range(n)]
