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

Ports free at the same time leave in port order, as in the reference. Which ports hold a
packet is kept in C (`busy`), the reference's set of busy ports a view of it here.

The C is generated into the build's source (`source()`), the structs declared once below for
both the C and cffi's cdef.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from testbed.switch.native.build import build, load
from testbed.switch.pfc import PfcConfig, PfcPortCounters, WatchdogConfig
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
    int64_t pfc_items; /* of them, counted by PFC against an ingress port (in_port >= 0) */
    int64_t port_hi; /* one past the highest port made: what a scan of the ports covers */
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
                  int64_t nbytes, int64_t now_ns, int64_t *found);
int64_t xm_tm_dequeue_ready(xm_tm *tm, int64_t now_ns, xm_tm_departure *out, int64_t cap);
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

/* TrafficManager.enqueue with PFC off: 1 and the queue found (packets, bytes), or 0 when full */
int xm_tm_enqueue(xm_tm *tm, int64_t port, int64_t prio, uint64_t handle, uint64_t cpkt,
                  int64_t nbytes, int64_t now_ns, int64_t *found)
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
    xm_tm_item item = {{handle, cpkt, nbytes, now_ns, expected, -1}};
    if (xm_tm_fifo_push(q, item)) return -1;
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
        int64_t n = 0;
        for (int64_t port = 0; port < tm->port_hi; port++)
            if (tm->busy[port]) ports[n++] = port;
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
    for (int64_t port = 0; port < tm->port_hi; port++) {{
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
    for (int64_t i = 0; i < n; i++) handles[i] = xm_tm_fifo_pop(q).handle;
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
    ingress port), for the reference's code (PFC, flushes) run on the C state."""

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

    def append(self, item: tuple[Any, int, int, int, int]) -> None:
        tm = self._tm
        pkt, nbytes, enq_ns, expected, in_port = item
        h = tm._register(pkt)
        cpkt = tm.cpkt(pkt)
        if tm.lib.xm_tm_fifo_push(self._q, (h, cpkt, nbytes, enq_ns, expected, in_port)):
            raise MemoryError("the native traffic manager could not grow a queue")
        tm._c.queued += 1
        if in_port >= 0:
            tm._c.pfc_items += 1

    def popleft(self) -> tuple[Any, int, int, int, int]:
        if not self._q.len:
            raise IndexError("pop from an empty deque")
        tm = self._tm
        if not self._q.items[self._q.head].handle:
            tm._adopt(self._q.items[self._q.head])
        it = tm.lib.xm_tm_fifo_pop(self._q)
        tm._c.queued -= 1
        if it.in_port >= 0:
            tm._c.pfc_items -= 1
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


class NativePortFault(PortFault):
    """A port's fault: what the data path reads (delay, rate factor, silent) in C."""

    def __init__(self, c: Any) -> None:  # noqa: D107 - the dataclass's fields, in C and here
        self._c = c
        self.loss = 0.0

    down = _cflag("fault_down")  # type: ignore[assignment]
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
        self.rx_errors = 0
        self.silent_drops = 0
        self.pfc = PfcPortCounters()

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

    def resize(self, booked_bytes: int, sent_bytes: int) -> None:
        self._tm.lib.xm_tm_resize(self._tm._c, self.port, booked_bytes, sent_bytes)


class NativeTrafficManager(TrafficManager):
    """The traffic manager with its queues and port state in C: the reference's methods run
    unchanged on that state (configuration, PFC, the watchdog, flushes), and with PFC off the
    per-packet ones (enqueue, dequeue_ready, next_departure_ns) run in C. Packets are held
    in `packets` by the integer handles the C queues carry."""

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
        # told before the state leaves C (`_to_reference`): what holds its address stops
        self.leaving_native: Callable[[], None] = lambda: None
        super().__init__(clock, nb_queues, depth_pkts)
        self._busy = _PortFlags(self._c, "busy")  # type: ignore[assignment]
        self.rx_faults = _PortFlags(self._c, "rx_fault")  # type: ignore[assignment]

    def __del__(self) -> None:
        lib = getattr(self, "lib", None)
        if lib is not None:
            lib.xm_tm_free(self._c)

    default_depth_pkts = _cfield("default_depth_pkts")  # type: ignore[assignment]
    default_depth_bytes = _cfield("default_depth_bytes")  # type: ignore[assignment]
    default_rate_pps = _cfield("default_rate_pps")  # type: ignore[assignment]
    default_rate_bps = _cfield("default_rate_bps")  # type: ignore[assignment]
    buffered_bytes = _cfield("buffered_bytes")  # type: ignore[assignment]

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
        many. PFC must be off (`native`)."""
        cap = int(self._c.queued)
        if not cap:
            return 0
        if cap > self._out_cap:
            self._out_cap = max(cap, 2 * self._out_cap)
            self._out = self.ffi.new("xm_tm_departure[]", self._out_cap)
        return int(self.lib.xm_tm_dequeue_ready(self._c, now_ns, self._out, cap))

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

    def native(self) -> bool:
        """Whether the per-packet path may run in C: PFC off and no packet PFC counted."""
        return self.pfc is None and not self._c.pfc_items

    def enqueue(
        self, port: int, prio: int, pkt: Any, nbytes: int, now_ns: int, ingress_port: int = -1
    ) -> tuple[int, int] | None:
        if not self.native():
            return super().enqueue(port, prio, pkt, nbytes, now_ns, ingress_port)
        if port not in self.ports:
            self.port(port)
        h = self._register(pkt)
        rc = self.lib.xm_tm_enqueue(
            self._c, port, prio, h, self.cpkt(pkt), nbytes, now_ns, self._found
        )
        if rc <= 0:
            del self.packets[h]
            if rc < 0:
                raise MemoryError("the native traffic manager could not grow a queue")
            self.last_drop = "queue_full"
            return None
        return int(self._found[0]), int(self._found[1])

    def dequeue_ready(self, now_ns: int) -> list[tuple[int, int, Any, int, int, int]]:
        if not self.native():
            return super().dequeue_ready(now_ns)
        n = self.dequeue_native(now_ns)
        out = self._out
        res = []
        for i in range(n):
            d = out[i]
            res.append((d.port, d.prio, self.take(d), d.enq_ns, d.left, d.start))
        return res

    def next_departure_ns(self) -> int | None:
        if self.pfc is not None:
            return super().next_departure_ns()
        return int(self._t[0]) if self.lib.xm_tm_next_departure(self._c, self._t) else None

    def set_pfc(self, pfc: PfcConfig | None, watchdog: WatchdogConfig | None = None) -> None:
        """PFC on: this traffic manager becomes the reference, its state moved into Python
        (PFC's per-packet counting is not in C yet, and the reference's code on the C state is
        slower than on its own)."""
        if pfc is not None:
            self._to_reference()
        TrafficManager.set_pfc(self, pfc, watchdog)

    @classmethod
    def from_reference(cls, old: TrafficManager) -> NativeTrafficManager | None:
        """A native traffic manager with the state of `old` (a reference one, as
        `_to_reference` made it: PFC off again), or None while `old` has PFC on or a packet
        queued (the state moves only when there is none to move)."""
        if old.pfc is not None or any(any(pq.queues) for pq in old.ports.values()):
            return None
        new = cls(old.clock, old.nb_queues, old.default_depth_pkts)
        in_c = {"default_depth_pkts", "default_depth_bytes", "default_rate_pps"}
        in_c |= {"default_rate_bps", "buffered_bytes", "buffer", "ports", "_busy", "rx_faults"}
        for name in ("default_depth_bytes", "default_rate_pps", "default_rate_bps", "buffer"):
            setattr(new, name, getattr(old, name))
        # the rest of the reference's own state as it is (the loss draws' generator, the
        # driver's callbacks, PFC's leftovers), not what its native past left behind
        for name in TrafficManager(old.clock, old.nb_queues).__dict__.keys() - in_c:
            new.__dict__[name] = old.__dict__[name]
        for port, pq in old.ports.items():
            view = new.port(port)
            for f in dataclasses.fields(PortQueues):
                if f.name in ("port", "nb_queues", "queues"):
                    continue
                value = getattr(pq, f.name)
                if f.name == "fault":
                    for k in ("down", "loss", "delay_ns", "rate_factor", "silent"):
                        setattr(view.fault, k, getattr(value, k))
                elif isinstance(getattr(view, f.name), _Array):
                    for i, v in enumerate(value):
                        getattr(view, f.name)[i] = v
                else:
                    setattr(view, f.name, value)
        for port in old.rx_faults:
            new.rx_faults.add(port)
        return new

    def _to_reference(self) -> None:
        """Turn this object into a TrafficManager holding the same state in Python."""
        self.leaving_native()
        plain = {
            name: getattr(self, name)
            for name in (
                "default_depth_pkts",
                "default_depth_bytes",
                "default_rate_pps",
                "default_rate_bps",
                "buffered_bytes",
                "buffer",
            )
        }
        busy, rx_faults = set(self._busy), set(self.rx_faults)
        ports: dict[int, PortQueues] = {}
        for port, view in self.ports.items():
            values: dict[str, Any] = {}
            for f in dataclasses.fields(PortQueues):
                v = getattr(view, f.name)
                if f.name == "queues":
                    v = [deque(q) for q in v]
                elif isinstance(v, _Array):
                    v = list(v)
                elif isinstance(v, PortFault):
                    v = PortFault(v.down, v.loss, v.delay_ns, v.rate_factor, v.silent)
                values[f.name] = v
            pq = PortQueues.__new__(PortQueues)
            pq.__dict__.update(values)
            ports[port] = pq
        self.lib.xm_tm_free(self._c)
        for name in ("ffi", "lib", "_mem", "_c", "packets", "_out", "_found", "_t"):
            self.__dict__.pop(name, None)
        self.__class__ = TrafficManager  # type: ignore[assignment]
        self.__dict__.update(plain)
        self.ports = ports
        self._busy, self.rx_faults = busy, rx_faults
