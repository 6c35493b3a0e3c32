"""The twin's event loop with its switch hops in C: the heap of events, the links (wires) and
each switch's common per-packet path, so a frame crossing the fabric runs no Python between
the hosts.

This is the C under testbed/sim/native_loop.py (which says how the twin uses it), appended to
every native pipeline's generated source that has the architecture's common path (cgen.py),
so it calls that program's `xm_receive_enqueue` and `xm_depart_batch` and the traffic
manager's C directly. What it does is what the reference does, in the same order:

- the heap orders events by (time, sequence number), the sequence shared with the events
  Python schedules (testbed/sim/engine.py's EventLoop);
- a wire (testbed/sim/fabric.py's `Wire`) delivers a frame after its serialization and delay,
  counting frames over its MTU;
- a switch's arrival and service are SimSwitch's `receive`, `_schedule` and `_service` with
  v1model.py's `_receive_native` and `_service_native` on the native traffic manager, the
  packets held in C from arrival to departure (a queued item's handle 0).

Whatever the common path does not cover runs in Python, through callbacks the loop is given:
a switch whose per-packet path is not native at the moment (its tables changed and not yet
synced, a program just loaded), a frame on a port that is down or a MAC Control frame, a
packet the program clones, recirculates, drops or sends to a port with no wire (the
collector's, the CPU's), and PFC's pause frames and timers (the pauses the traffic manager's
C decides are sent from Python right after it decides them, when the reference sends them).
A callback gets the C packet when there is one; Python then owns it.
"""

from __future__ import annotations

from controller.wire.pfc import ETH_HEADER
from controller.wire.stamp import STAMP, STAMP_MAGIC
from testbed.switch.traffic_manager import MAX_PORT

# what xm_loop_run hands back to Python
RUN_EMPTY = 0  # no event left
RUN_UNTIL = 1  # the next event is after `until`
RUN_PYTHON = 2  # a Python event: its handle in py_handle
RUN_DELIVER = 3  # a frame for a Python target (a host): py_handle, py_data, py_len
RUN_FAILED = 4  # a callback raised: Python re-raises what it kept
# a host in C (testbed/sim/host_native.c) left part of its event to Python: py_handle the
# host, py_code what to do (py_data, py_len the frame that arrived, if one did)
RUN_HOST = 5
HOST_KICK, HOST_TIMER = 0, 1  # xm_loop_push_host's kinds

_NPORTS = MAX_PORT + 1
RX_BATCH = 64  # frames read from one port before looking at the others
# what one direction of an emulated port's delay line holds (testbed/switch/dataplane.py's
# DelayLine): its socket buffers' size; more is dropped and counted
LINE_MAX_BYTES = 4 * 2**20

# declared once: the C and cffi's cdef read these
_STRUCTS = """
typedef struct { /* a frame in flight: room for the packet a switch makes of it, its bytes */
    xm_packet p;
    int64_t len;
    uint8_t data[];
} xm_block;

typedef struct {
    double ns_per_byte;
    int64_t delay_ns;
    int64_t max_frame;
    int64_t to_switch; /* the switch it delivers to, or -1: a Python target */
    int64_t to; /* that switch's port, or the Python target's handle */
    int64_t frames;
    int64_t too_big;
    int64_t host; /* the C host it delivers to (loop.hosts), or -1 */
} xm_wire;

typedef struct { /* the emulation: a port's link in time (dataplane.py's Wire and DelayLine) */
    double ns_per_byte;
    int64_t delay_ns;
    int64_t ingress; /* the frames coming in wait too (the far end, a host, cannot) */
    int64_t stamped; /* the far end is a switch: frames go at once with their due (STAMP) */
    int64_t port;
    int64_t free_at[2]; /* per direction (0 out, 1 in): when its last frame is all on it */
    int64_t bytes[2];
    void *head[2]; /* the frames held, oldest first (xm_held) */
    void *tail[2];
} xm_line;

typedef struct {
    uint64_t state; /* the switch's xm_state */
    uint64_t tm; /* its xm_tm */
    int64_t fast; /* Python's: its per-packet path may run here now */
    int64_t dirty; /* the pipeline's tables changed in Python, not synced to C yet */
    int64_t drop_port;
    int64_t unit;
    int64_t cell;
    int64_t port_mask;
    int64_t clock_ns; /* the switch's clock: the time of its latest event */
    int64_t service_at; /* the service due, or -1 */
    int64_t rx; /* V1Switch.stats */
    int64_t tx;
    int64_t queue_full; /* its drops of a full queue whose report the pacing held back */
    int64_t rx_error; /* its drops of frames a `loss` fault corrupted */
    int64_t deps_cap;
    void *deps; /* xm_tm_departure[deps_cap] */
    int64_t wire[NPORTS]; /* the twin: the loop's wire out of each port, or -1 */
    int64_t fd[NPORTS]; /* the emulation: each port's packet socket, or -1 */
    uint8_t counted[NPORTS]; /* the port has counters (SimSwitch.ports) */
    uint8_t known[NPORTS]; /* Python has made the port's queues (tm.ports) */
    int64_t port_rx[NPORTS];
    int64_t port_tx[NPORTS];
    int64_t port_rx_bytes[NPORTS];
    int64_t port_tx_bytes[NPORTS];
    int64_t port_tx_errors[NPORTS];
    int64_t port_rx_down[NPORTS];
    int64_t port_line_drops[NPORTS]; /* frames over what the port's delay line holds */
    int64_t port_line_late_ns[NPORTS]; /* how much later than due its frames left its line out
                                        * (a stamped line: how late they came in) */
    int64_t port_line_unstamped[NPORTS]; /* frames read on a stamped line without a stamp */
    int64_t line_of[NPORTS]; /* the emulation: 1 + the port's index in lines, or 0 */
    xm_line *lines;
    int64_t nlines;
    int64_t slack_ns; /* the emulation: how late its loop may take what arrives (xm_emu_plan) */
    void *rx_head; /* the frames read from sockets, not yet arrived (xm_held, read order) */
    void *rx_tail;
    int64_t rx_seq; /* the order frames were read and held in, for ties in time */
    int64_t start_ns; /* the emulation: CLOCK_MONOTONIC at the switch's time zero */
} xm_hop;

typedef struct {
    void *heap;
    int64_t n;
    int64_t cap;
    int64_t now;
    int64_t seq;
    int64_t events;
    xm_hop *hops;
    int64_t nhops;
    xm_wire *wires;
    int64_t nwires;
    uint8_t *out; /* xm_depart_batch's frames */
    int64_t out_cap;
    xm_departed *res;
    int64_t res_cap;
    int64_t failed; /* a callback raised */
    int64_t real_time; /* the emulation's switch: no heap, the caller services by the clock */
    uint8_t *rx; /* the emulation's receive buffer (XM_RX_MAX bytes) */
    void **batch; /* xm_emu_service's frames arriving, in time order (xm_held *) */
    int64_t batch_cap;
    int64_t py_handle; /* what run hands back */
    const uint8_t *py_data;
    int64_t py_len;
    void *py_block; /* the frame handed back, freed at the next run */
    int64_t py_code; /* RUN_HOST's */
    /* the hosts whose per-packet loop is C (testbed/sim/host_native.c), by number: their
     * entry points, as addresses (built apart), and each host's state or NULL */
    int64_t (*host_rx)(void *host, const uint8_t *data, int64_t len, int64_t now);
    int64_t (*host_event)(void *host, int64_t kind, int64_t a, int64_t now);
    void **hosts;
    int64_t nhosts;
    /* into Python, for what the C does not do */
    void (*receive)(int64_t node, int64_t port, const uint8_t *data, int64_t len);
    void (*after_receive)(int64_t node, int64_t port, int64_t rc, uint64_t packet);
    void (*port_made)(int64_t node, int64_t port);
    void (*service)(int64_t node);
    void (*schedule)(int64_t node);
    void (*transmit)(int64_t node, int64_t port, const uint8_t *data, int64_t len);
    void (*pfc)(int64_t node, int64_t tick); /* pauses decided, or (tick) a PFC timer due */
    void (*release)(int64_t node, uint64_t handle);
    void (*not_sent)(int64_t node, int64_t k);
    void (*foreign)(int64_t node, int64_t k);
} xm_loop;
"""

_FUNCS = """
int xm_loop_init(xm_loop *L);
void xm_loop_free(xm_loop *L);
int xm_loop_at(xm_loop *L, int64_t t, int64_t handle);
int64_t xm_loop_run(xm_loop *L, int64_t until);
int xm_wire_send(xm_loop *L, int64_t wire, const uint8_t *data, int64_t len, int64_t t);
int xm_hop_schedule_at(xm_loop *L, int64_t node, int64_t t);
int xm_loop_push_host(void *loop, int64_t t, int64_t kind, int64_t host, int64_t a);
int64_t xm_emu_read(xm_loop *L, int64_t node, int64_t port, int64_t max, int64_t start_ns,
                    int64_t offset_ns);
int64_t xm_emu_service(xm_loop *L, int64_t node, int64_t start_ns);
int64_t xm_emu_loop(xm_loop *L, int64_t node, uint64_t mutex, const int64_t *ports,
                    int64_t nports, int64_t wake_fd, int64_t start_ns, int64_t offset_ns,
                    int64_t until_ns);
void xm_hop_free_packet(void *packet);
int64_t xm_emu_line_put(xm_loop *L, int64_t node, int64_t port, int64_t in, const uint8_t *data,
                        int64_t len, int64_t t);
int64_t xm_emu_next_due(xm_loop *L, int64_t node, int64_t in, int64_t *due);
int64_t xm_emu_plan(int64_t have_hard, int64_t hard, int64_t have_soft, int64_t soft,
                    int64_t slack_ns, int64_t now, int64_t *wake);
int64_t xm_emu_lines_drop(xm_loop *L, int64_t node);
"""

_C = r"""
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#define XM_RX_MAX 65536 /* the largest frame a packet socket gives (MAX_FRAME + 1) */
#define XM_LINE_MAX_BYTES LINE_MAX_BYTES_VALUE /* what one direction of a delay line holds */
#define XM_RX_BATCH RX_BATCH_VALUE /* frames read from one port before the others */
#define XM_STAMP_BYTES STAMP_BYTES_VALUE /* a stamped line's frames' due and magic (STAMP) */
#define XM_STAMP_MAGIC STAMP_MAGIC_VALUE
#define XM_ETH_HEADER ETH_HEADER_VALUE /* an Ethernet header's bytes */
#define XM_EV_PY 0 /* a Python event: run returns its handle */
#define XM_EV_RX 1 /* a frame arrives at a switch's port */
#define XM_EV_SERVICE 2 /* a switch's traffic manager may send */
#define XM_EV_DELIVER 3 /* a frame arrives at a Python target (or a C host): run returns it */
#define XM_EV_HOST 4 /* a C host's event: XM_EV_HOST + its kind (HOST_KICK, HOST_TIMER) */
#define XM_RUN_EMPTY 0
#define XM_RUN_UNTIL 1
#define XM_RUN_PYTHON 2
#define XM_RUN_DELIVER 3
#define XM_RUN_FAILED 4
#define XM_RUN_HOST 5

typedef struct {
    int64_t t;
    int64_t seq;
    int64_t kind;
    int64_t node;
    int64_t a; /* the Python handle, the port, or the service time */
    void *block;
} xm_ev;

static int ev_before(const xm_ev *a, const xm_ev *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

int xm_loop_init(xm_loop *L)
{
    L->cap = 1024;
    L->heap = malloc((size_t)L->cap * sizeof(xm_ev));
    L->out_cap = 1 << 20;
    L->out = malloc((size_t)L->out_cap);
    L->res_cap = 64;
    L->res = malloc((size_t)L->res_cap * sizeof(xm_departed));
    L->rx = malloc(XM_RX_MAX);
    return L->heap && L->out && L->res && L->rx ? 0 : -1;
}

static int64_t rx_drop(xm_hop *h);

void xm_loop_free(xm_loop *L)
{
    xm_ev *h = L->heap;
    for (int64_t i = 0; i < L->n; i++) free(h[i].block);
    free(L->heap);
    free(L->out);
    free(L->res);
    free(L->py_block);
    free(L->rx);
    L->rx = NULL;
    free(L->batch);
    L->batch = NULL;
    L->batch_cap = 0;
    for (int64_t i = 0; i < L->nhops; i++) {
        free(L->hops[i].deps);
        rx_drop(&L->hops[i]);
    }
    L->heap = NULL;
    L->out = NULL;
    L->res = NULL;
    L->py_block = NULL;
    L->n = 0;
}

/* EventLoop.at: due at t (not before now), after what is already due then */
static int push(xm_loop *L, int64_t t, int64_t kind, int64_t node, int64_t a, void *block)
{
    if (L->n == L->cap) {
        xm_ev *h = realloc(L->heap, (size_t)(2 * L->cap) * sizeof(xm_ev));
        if (!h) return -1;
        L->heap = h;
        L->cap *= 2;
    }
    xm_ev *h = L->heap;
    xm_ev e = {t < L->now ? L->now : t, ++L->seq, kind, node, a, block};
    int64_t i = L->n++;
    while (i > 0) {
        int64_t up = (i - 1) / 2;
        if (!ev_before(&e, &h[up])) break;
        h[i] = h[up];
        i = up;
    }
    h[i] = e;
    return 0;
}

static xm_ev pop(xm_loop *L)
{
    xm_ev *h = L->heap;
    xm_ev top = h[0], last = h[--L->n];
    int64_t i = 0, n = L->n;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && ev_before(&h[c + 1], &h[c])) c++;
        if (!ev_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = last;
    return top;
}

int xm_loop_at(xm_loop *L, int64_t t, int64_t handle)
{
    return push(L, t, XM_EV_PY, 0, handle, NULL);
}

/* a C host's event (host_native.c calls it through its address) */
int xm_loop_push_host(void *loop, int64_t t, int64_t kind, int64_t host, int64_t a)
{
    return push((xm_loop *)loop, t, XM_EV_HOST + kind, host, a, NULL);
}

void xm_hop_free_packet(void *packet)
{
    free(packet); /* the packet is its block's first member */
}

/* Wire.send: the frame leaves at t and arrives whole after its serialization and delay;
 * 0 for a frame over the link's MTU (counted, not sent), -1 out of memory */
int xm_wire_send(xm_loop *L, int64_t wire, const uint8_t *data, int64_t len, int64_t t)
{
    xm_wire *w = &L->wires[wire];
    if (len > w->max_frame) {
        w->too_big++;
        return 0;
    }
    w->frames++;
    xm_block *b = malloc(sizeof(xm_block) + (size_t)len);
    if (!b) return -1;
    b->len = len;
    memcpy(b->data, data, (size_t)len);
    int64_t at = t + (int64_t)((double)len * w->ns_per_byte) + w->delay_ns;
    int64_t kind = w->to_switch >= 0 ? XM_EV_RX : XM_EV_DELIVER;
    if (push(L, at, kind, w->to_switch >= 0 ? w->to_switch : w->host, w->to, b)) {
        free(b);
        return -1;
    }
    return 1;
}

/* SimSwitch._schedule, the next departure known: a service at t (not before now) unless
 * one is due by then */
int xm_hop_schedule_at(xm_loop *L, int64_t node, int64_t t)
{
    xm_hop *h = &L->hops[node];
    int64_t now = L->now, at = h->service_at;
    if (at >= 0 && at <= now) return 0; /* a service due now runs anyway */
    if (t < now) t = now;
    if (at >= 0 && at <= t) return 0;
    h->service_at = t;
    return push(L, t, XM_EV_SERVICE, node, t, NULL);
}

static void schedule(xm_loop *L, int64_t node)
{
    xm_hop *h = &L->hops[node];
    int64_t t;
    if (L->real_time) return; /* the emulation's loop asks the traffic manager itself */
    if (!h->fast) { /* a callback made the path Python's: so is the traffic manager */
        L->schedule(node);
        return;
    }
    if (xm_tm_next_departure((xm_tm *)(uintptr_t)h->tm, &t)) xm_hop_schedule_at(L, node, t);
}

/* an array of *cap items of `size` holding at least `want`: 0, or -1 out of memory */
static int grow(void **items, int64_t *cap, int64_t want, size_t size)
{
    if (want <= *cap) return 0;
    int64_t c = 2 * *cap > want ? 2 * *cap : want;
    void *p = realloc(*items, (size_t)c * size);
    if (!p) return -1;
    *items = p;
    *cap = c;
    return 0;
}

/* a MAC Control frame (PFC's): consumed by the MAC, left to Python */
static int mac_control(const uint8_t *data, int64_t len)
{
    return len >= XM_ETH_HEADER && data[12] == 0x88 && data[13] == 0x08;
}

/* v1model.py's _not_queued for a full queue when its drop report is held back (drop_reports.py:
 * one report per gap): counted here, nothing for Python to do */
static int queue_full_held(xm_loop *L, int64_t node, xm_block *b, xm_tm *tm)
{
    xm_hop *h = &L->hops[node];
    int64_t port = v1model_egress_spec(&b->p);
    if (port < 0 || port >= NPORTS || !h->known[port]) return 0;
    if (!xm_tm_report_held(tm, port, XM_REPORT_QUEUE_FULL, L->now)) return 0;
    h->queue_full++;
    return 1;
}

/* SimSwitch.receive with v1model.py's _receive_native */
static void hop_receive(xm_loop *L, int64_t node, int64_t port, xm_block *b)
{
    xm_hop *h = &L->hops[node];
    xm_tm *tm = (xm_tm *)(uintptr_t)h->tm;
    h->clock_ns = L->now;
    /* a port with a receive fault: a `loss` fault's draw is C's while it holds draws, the
     * rest (a port down, no draw left: Python fills them) Python's */
    int lossy = h->fast && port >= 0 && port < NPORTS && tm->rx_fault[port] &&
                !tm->ports[port].fault_down && tm->rx_draws_left;
    if (!h->fast || h->dirty || port < 0 || port >= NPORTS || (tm->rx_fault[port] && !lossy) ||
        mac_control(b->data, b->len)) {
        L->receive(node, port, b->data, b->len);
        free(b);
        return;
    }
    h->rx++;
    if (!L->real_time && h->counted[port]) { /* the emulation's read counted it */
        h->port_rx[port]++;
        h->port_rx_bytes[port] += b->len;
    }
    if (lossy && xm_tm_corrupted(tm, port)) { /* corrupted on the wire: the MAC drops it */
        h->rx_error++;
        free(b);
        schedule(L, node);
        return;
    }
    int64_t rc = xm_receive_enqueue((xm_state *)(uintptr_t)h->state, &b->p, b->data,
                                    (uint64_t)b->len, (uint64_t)(port & h->port_mask),
                                    (uint64_t)L->now, (uint64_t)h->drop_port, h->tm, 0, h->unit,
                                    h->cell);
    if (tm->npause) L->pfc(node, 0); /* PFC paused the port it came in on */
    if (rc >= 0) {
        if (!h->known[rc]) L->port_made(node, rc);
    } else if (rc == ARCH_QUEUE_FULL && queue_full_held(L, node, b, tm)) {
        free(b);
    } else {
        L->after_receive(node, port, rc, (uint64_t)(uintptr_t)b); /* Python owns it now */
    }
    schedule(L, node);
}

/* ---- the emulation's delay lines (testbed/switch/dataplane.py's DelayLine) */

typedef struct xm_held { /* a frame on a line, or read and not yet arrived */
    struct xm_held *next;
    int64_t due; /* when it arrives whole (on a line) or arrived (read from a socket) */
    int64_t port;
    int64_t seq; /* the hop's rx_seq when it was held: ties in time keep this order */
    int64_t len;
    uint8_t data[];
} xm_held;

static xm_held *held_new(xm_hop *h, int64_t port, const uint8_t *data, int64_t len, int64_t due)
{
    xm_held *f = malloc(sizeof(xm_held) + (size_t)len);
    if (!f) return NULL;
    f->next = NULL;
    f->due = due;
    f->port = port;
    f->seq = h->rx_seq++;
    f->len = len;
    memcpy(f->data, data, (size_t)len);
    return f;
}

/* the frames read and not yet arrived, dropped: how many (counted as the lines' drops) */
static int64_t rx_drop(xm_hop *h)
{
    int64_t n = 0;
    while (h->rx_head) {
        xm_held *f = h->rx_head;
        h->rx_head = f->next;
        if (f->port >= 0 && f->port < NPORTS) h->port_line_drops[f->port]++;
        free(f);
        n++;
    }
    h->rx_tail = NULL;
    return n;
}

/* a frame onto the line's direction `in`, due at `due` */
static void line_append(xm_line *l, int64_t in, xm_held *f)
{
    if (l->tail[in])
        ((xm_held *)l->tail[in])->next = f;
    else
        l->head[in] = f;
    l->tail[in] = f;
    l->bytes[in] += f->len;
}

/* DelayLine.due_of: a frame handed over at t goes on the wire once the frame ahead of it is
 * on it, and is due whole its serialization at the link's rate and the link's delay later */
static int64_t line_due(xm_line *l, int64_t in, int64_t len, int64_t t)
{
    int64_t start = t > l->free_at[in] ? t : l->free_at[in];
    l->free_at[in] = start + (int64_t)((double)len * l->ns_per_byte);
    return l->free_at[in] + l->delay_ns;
}

/* Port.send with a stamp: the frame and after it its due (CLOCK_MONOTONIC) and the magic */
static void port_send_stamped(xm_hop *h, int64_t port, const uint8_t *data, int64_t len,
                              int64_t due)
{
    uint8_t stamp[XM_STAMP_BYTES];
    uint64_t at = (uint64_t)(due + h->start_ns);
    for (int i = 0; i < 8; i++) stamp[i] = (uint8_t)(at >> (56 - 8 * i));
    for (int i = 0; i < 4; i++) stamp[8 + i] = (uint8_t)((uint32_t)XM_STAMP_MAGIC >> (24 - 8 * i));
    struct iovec iov[2] = {{(void *)data, (size_t)len}, {stamp, sizeof stamp}};
    struct msghdr msg = {0};
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    if (sendmsg((int)h->fd[port], &msg, 0) < 0) {
        h->port_tx_errors[port]++;
    } else {
        h->port_tx[port]++;
        h->port_tx_bytes[port] += len;
    }
}

/* DelayLine.put, or on a stamped line's way out Dataplane's send at once with the frame's
 * due: 1 held (sent), 0 dropped (over XM_LINE_MAX_BYTES: counted), -1 out of memory */
static int line_put(xm_hop *h, int64_t port, int64_t in, const uint8_t *data, int64_t len,
                    int64_t t)
{
    xm_line *l = &h->lines[h->line_of[port] - 1];
    if (!in && l->stamped) {
        port_send_stamped(h, port, data, len, line_due(l, 0, len, t));
        return 1;
    }
    if (l->bytes[in] + len > XM_LINE_MAX_BYTES) {
        h->port_line_drops[port]++;
        return 0;
    }
    xm_held *f = held_new(h, port, data, len, line_due(l, in, len, t));
    if (!f) return -1;
    line_append(l, in, f);
    return 1;
}

/* DelayLine.hold: a frame read on a stamped line, held until the due it carries (no earlier
 * than the frame ahead of it: a link keeps their order); 1 held, 0 dropped (counted), -1 out
 * of memory */
static int line_hold(xm_hop *h, int64_t port, const uint8_t *data, int64_t len, int64_t due)
{
    xm_line *l = &h->lines[h->line_of[port] - 1];
    if (l->bytes[1] + len > XM_LINE_MAX_BYTES) {
        h->port_line_drops[port]++;
        return 0;
    }
    if (l->tail[1] && ((xm_held *)l->tail[1])->due > due) due = ((xm_held *)l->tail[1])->due;
    xm_held *f = held_new(h, port, data, len, due);
    if (!f) return -1;
    line_append(l, 1, f);
    return 1;
}

/* DelayLine.holds_no_later: the furthest ahead a frame on the line can be due (a full
 * line's serialization and the delay): a stamp due later is not one its far end made */
static int64_t line_holds_no_later(const xm_line *l)
{
    return l->delay_ns + (int64_t)(XM_LINE_MAX_BYTES * l->ns_per_byte);
}

/* the due a stamped frame of n bytes carries (CLOCK_MONOTONIC): 1 and *due, or 0 (none) */
static int unstamp(const uint8_t *frame, int64_t n, int64_t *due)
{
    if (n < XM_ETH_HEADER + XM_STAMP_BYTES) return 0;
    const uint8_t *s = frame + n - XM_STAMP_BYTES;
    uint32_t magic = 0;
    uint64_t at = 0;
    for (int i = 0; i < 4; i++) magic = magic << 8 | s[8 + i];
    if (magic != (uint32_t)XM_STAMP_MAGIC) return 0;
    for (int i = 0; i < 8; i++) at = at << 8 | s[i];
    *due = (int64_t)at;
    return 1;
}

static xm_held *line_take(xm_line *l, int64_t in)
{
    xm_held *f = l->head[in];
    l->head[in] = f->next;
    if (!l->head[in]) l->tail[in] = NULL;
    l->bytes[in] -= f->len;
    return f;
}

/* Dataplane's _line_put for what Python sends or reads (a port with a line): 1 held, 0
 * dropped, -1 out of memory, -2 the port has no line */
int64_t xm_emu_line_put(xm_loop *L, int64_t node, int64_t port, int64_t in, const uint8_t *data,
                        int64_t len, int64_t t)
{
    xm_hop *h = &L->hops[node];
    if (port < 0 || port >= NPORTS || !h->line_of[port]) return -2;
    return line_put(h, port, in, data, len, t);
}

/* the earliest frame due on the lines of one direction (0 out, 1 in): 1 and *due, or 0 */
int64_t xm_emu_next_due(xm_loop *L, int64_t node, int64_t in, int64_t *due)
{
    xm_hop *h = &L->hops[node];
    int have = 0;
    for (int64_t i = 0; i < h->nlines; i++) {
        xm_held *f = h->lines[i].head[in != 0];
        if (f && (!have || f->due < *due)) {
            *due = f->due;
            have = 1;
        }
    }
    return have;
}

/* Dataplane.wait_plan: when the loop wakes next and whether it polls the ports until then.
 * A frame leaving on a line must leave when due (hard); a frame a line brings in, a
 * departure (soft) and a frame read from a socket may be taken up to slack_ns late, for
 * each leads at most to a frame on a line, due a link's delay or more after it (slack_ns is
 * half the shortest: Dataplane's). So the loop wakes at the hard time or slack_ns after the
 * soft one, whichever is first, and a wait that ends within slack_ns does not wake for a
 * socket's frame: it reads the ports' frames when it ends. slack_ns 0: a wait wakes for each
 * frame, and for each soft time. Returns bit 0: *wake set (else no wake is due), bit 1:
 * poll the ports. */
int64_t xm_emu_plan(int64_t have_hard, int64_t hard, int64_t have_soft, int64_t soft,
                    int64_t slack_ns, int64_t now, int64_t *wake)
{
    if (have_soft) soft += slack_ns;
    if (have_hard && (!have_soft || hard < soft)) soft = hard;
    if (!have_hard && !have_soft) return 2;
    *wake = soft;
    return 1 | (slack_ns > 0 && soft - now <= slack_ns ? 0 : 2);
}

/* the frames the lines hold and those read and not yet arrived, dropped (the hop
 * replaced): how many */
int64_t xm_emu_lines_drop(xm_loop *L, int64_t node)
{
    xm_hop *h = &L->hops[node];
    int64_t n = rx_drop(h);
    for (int64_t i = 0; i < h->nlines; i++)
        for (int in = 0; in < 2; in++)
            while (h->lines[i].head[in]) {
                h->port_line_drops[h->lines[i].port]++;
                free(line_take(&h->lines[i], in));
                n++;
            }
    return n;
}

/* Port.send: the frame out of the port's socket, counted */
static void port_send(xm_hop *h, int64_t port, const uint8_t *data, int64_t len)
{
    if (send((int)h->fd[port], data, (size_t)len, 0) < 0) {
        h->port_tx_errors[port]++;
    } else {
        h->port_tx[port]++;
        h->port_tx_bytes[port] += len;
    }
}

/* what SimSwitch._transmit does with a frame that left the pipeline (at `start`, its
 * departure's time: the emulation's line takes it from then, whenever the loop woke) */
static void transmit(xm_loop *L, int64_t node, int64_t port, const uint8_t *data, int64_t len,
                     int64_t start)
{
    xm_hop *h = &L->hops[node];
    int64_t w = port >= 0 && port < NPORTS ? h->wire[port] : -1;
    int64_t fd = w < 0 && port >= 0 && port < NPORTS ? h->fd[port] : -1;
    int control = mac_control(data, len);
    if (fd >= 0 && !control) { /* Dataplane._transmit: on its wire, or out at once */
        if (!h->line_of[port])
            port_send(h, port, data, len);
        else if (line_put(h, port, 0, data, len, start) < 0)
            L->failed = 1;
        return;
    }
    if (w < 0 || control) {
        L->transmit(node, port, data, len);
        return;
    }
    int rc = xm_wire_send(L, w, data, len, L->now);
    if (rc < 0) {
        L->failed = 1;
        return;
    }
    if (rc && h->counted[port]) {
        h->port_tx[port]++;
        h->port_tx_bytes[port] += len;
    }
}

/* v1model.py's service with _service_native: every departure due by now */
static void service_round(xm_loop *L, int64_t node)
{
    xm_hop *h = &L->hops[node];
    xm_tm *tm = (xm_tm *)(uintptr_t)h->tm;
    xm_state *s = (xm_state *)(uintptr_t)h->state;
    while (h->fast && !L->failed) {
        if (xm_tm_pfc_due(tm, L->now)) { /* v1model.py's service: pfc_tick first */
            L->pfc(node, 1);
            if (!h->fast || L->failed) break;
        }
        int64_t cap = tm->queued;
        if (!cap) break;
        if (grow(&h->deps, &h->deps_cap, cap, sizeof(xm_tm_departure)) ||
            grow((void **)&L->res, &L->res_cap, cap, sizeof(xm_departed))) {
            L->failed = 1;
            return;
        }
        int64_t n = xm_tm_dequeue_ready(tm, L->now, (xm_tm_departure *)h->deps, cap);
        if (tm->npause) { /* resumed upstreams, before the departures' egress */
            L->pfc(node, 0);
            if (L->failed) return;
        }
        if (!n) break;
        int64_t i = 0;
        while (i < n) {
            int64_t stop = xm_depart_batch(s, h->tm, (uint64_t)(uintptr_t)h->deps, i, n,
                                           (uint64_t)h->drop_port, h->unit, h->cell, L->out,
                                           (uint64_t)L->out_cap, L->res);
            for (int64_t j = i; j < stop; j++) {
                const xm_departed *r = &L->res[j];
                const xm_tm_departure *d = (const xm_tm_departure *)h->deps + j;
                xm_packet *p = (xm_packet *)(uintptr_t)d->cpkt;
                if (r->rc < 0) { /* not sent: v1model.py goes on with it (and owns it) */
                    L->not_sent(node, j);
                    continue;
                }
                const uint8_t *frame = L->out + r->off;
                int64_t len = r->rc;
                uint8_t *joined = NULL;
                if (len > L->out_cap - r->off) { /* the payload was left where it is */
                    int64_t head = len - (int64_t)p->payload_len;
                    joined = malloc((size_t)len);
                    if (!joined) {
                        L->failed = 1;
                        return;
                    }
                    memcpy(joined, frame, (size_t)head);
                    memcpy(joined + head, p->payload, p->payload_len);
                    frame = joined;
                }
                if (r->truncate >= 0 && r->truncate < len) len = r->truncate;
                if (len != r->booked) xm_tm_resize(tm, d->port, r->booked, len);
                h->tx++;
                transmit(L, node, d->port, frame, len, d->start);
                free(joined);
                if (d->handle)
                    L->release(node, d->handle);
                else
                    free(p);
            }
            if (stop == i) { /* not this pipeline's packet: v1model.py departs it */
                L->foreign(node, i);
                stop = i + 1;
            }
            i = stop;
        }
    }
}

/* SimSwitch._service */
static void hop_service(xm_loop *L, int64_t node, int64_t t)
{
    xm_hop *h = &L->hops[node];
    if (t != h->service_at) return; /* superseded by an earlier service */
    h->service_at = -1;
    h->clock_ns = L->now;
    if (!h->fast || h->dirty) {
        L->service(node);
        return;
    }
    service_round(L, node);
    if (!L->failed) schedule(L, node);
}

/* ---- the emulation's switch (testbed/switch/dataplane.py's loop, its per-frame part) */

static int64_t clock_ns(int64_t start_ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec - start_ns;
}

/* a frame at its time, as xm_emu_read takes one: the departures due by then first */
static void emu_arrive(xm_loop *L, int64_t node, int64_t port, const uint8_t *data, int64_t len,
                       int64_t t)
{
    xm_hop *h = &L->hops[node];
    if (!h->fast || h->dirty) { /* the whole frame is Python's, from its time */
        L->now = t;
        L->receive(node, port, data, len);
        return;
    }
    xm_block *b = malloc(sizeof(xm_block) + (size_t)len);
    if (!b) {
        L->failed = 1;
        return;
    }
    b->len = len;
    memcpy(b->data, data, (size_t)len);
    int64_t due;
    if (xm_tm_next_departure((xm_tm *)(uintptr_t)h->tm, &due) && due <= t) {
        L->now = t;
        service_round(L, node);
    }
    L->now = t;
    hop_receive(L, node, port, b);
}

/* Dataplane._read_port: up to max frames waiting on the port's socket, each at its kernel
 * arrival time (offset_ns maps it onto the switch's clock, which started at start_ns of
 * CLOCK_MONOTONIC): the departures due by then first, then the frame's arrival. The frames
 * read, or -errno (the batch stops there; a port gone down is counted, not an error). */
int64_t xm_emu_read(xm_loop *L, int64_t node, int64_t port, int64_t max, int64_t start_ns,
                    int64_t offset_ns)
{
    uint8_t *frame = L->rx;
    xm_hop *h = &L->hops[node];
    int64_t k;
    for (k = 0; k < max && !L->failed; k++) {
        union {
            struct cmsghdr align;
            uint8_t buf[CMSG_SPACE(sizeof(struct timespec))];
        } control;
        struct iovec iov = {frame, XM_RX_MAX - 1};
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof control.buf;
        ssize_t n = recvmsg((int)h->fd[port], &msg, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
            if (errno == ENETDOWN) { /* the interface went down under the socket */
                h->port_rx_down[port]++;
                break;
            }
            return -errno;
        }
        /* a frame with no kernel time (none here: the socket asks for them) is taken now */
        int64_t now = clock_ns(start_ns), t = now, real = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == 35 /* SO_TIMESTAMPNS */) {
                struct timespec ts;
                memcpy(&ts, CMSG_DATA(c), sizeof ts);
                real = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
            }
        }
        if (real && real - offset_ns < now) t = real - offset_ns;
        xm_line *l = h->line_of[port] ? &h->lines[h->line_of[port] - 1] : NULL;
        if (l && l->stamped && !mac_control(frame, n)) { /* held until the due it carries */
            int64_t due;
            if (!unstamp(frame, n, &due)) {
                h->port_line_unstamped[port]++;
                continue;
            }
            due -= h->start_ns;
            if (due - t > line_holds_no_later(l)) {
                h->port_line_unstamped[port]++;
                continue;
            }
            n -= XM_STAMP_BYTES;
            h->port_rx[port]++;
            h->port_rx_bytes[port] += n;
            if (t > due) h->port_line_late_ns[port] += t - due;
            if (line_hold(h, port, frame, n, due) < 0) L->failed = 1;
            continue;
        }
        h->port_rx[port]++;
        h->port_rx_bytes[port] += n;
        if (l && l->ingress) { /* on its wire yet */
            if (line_put(h, port, 1, frame, n, t) < 0) L->failed = 1;
            continue;
        }
        xm_held *f = held_new(h, port, frame, n, t); /* arrives in xm_emu_service, in order */
        if (!f) {
            L->failed = 1;
            break;
        }
        if (h->rx_tail)
            ((xm_held *)h->rx_tail)->next = f;
        else
            h->rx_head = f;
        h->rx_tail = f;
    }
    return k; /* the caller looks at failed */
}

static int held_before(const void *a, const void *b)
{
    const xm_held *x = *(xm_held *const *)a, *y = *(xm_held *const *)b;
    if (x->due != y->due) return x->due < y->due ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Dataplane._service after each poll: the frames read and those the lines bring in by now
 * arrive, all ports' in the order of their times (each after the departures due before it),
 * then every departure due by now, then the frames the lines deliver by now leave */
int64_t xm_emu_service(xm_loop *L, int64_t node, int64_t start_ns)
{
    xm_hop *h = &L->hops[node];
    int64_t now = clock_ns(start_ns), n = 0;
    for (xm_held *f = h->rx_head; f; f = f->next) n++;
    for (int64_t i = 0; i < h->nlines; i++)
        for (xm_held *f = h->lines[i].head[1]; f && f->due <= now; f = f->next) n++;
    if (grow((void **)&L->batch, &L->batch_cap, n, sizeof(void *))) {
        L->failed = 1;
        return 0;
    }
    xm_held **batch = (xm_held **)L->batch;
    int64_t k = 0;
    while (h->rx_head) {
        batch[k] = h->rx_head;
        h->rx_head = batch[k++]->next;
    }
    h->rx_tail = NULL;
    for (int64_t i = 0; i < h->nlines; i++) {
        xm_line *l = &h->lines[i];
        while (l->head[1] && ((xm_held *)l->head[1])->due <= now) batch[k++] = line_take(l, 1);
    }
    if (k > 1) qsort(batch, (size_t)k, sizeof *batch, held_before);
    for (int64_t i = 0; i < k; i++) {
        if (!L->failed)
            emu_arrive(L, node, batch[i]->port, batch[i]->data, batch[i]->len, batch[i]->due);
        else /* a callback raised: the batch's rest is dropped, counted as the lines' */
            h->port_line_drops[batch[i]->port]++;
        free(batch[i]);
    }
    if (L->failed) return 0;
    L->now = now;
    if (!h->fast || h->dirty)
        L->service(node);
    else
        service_round(L, node);
    for (int64_t i = 0; i < h->nlines; i++) {
        xm_line *l = &h->lines[i];
        int64_t port = l->port;
        while (l->head[0] && ((xm_held *)l->head[0])->due <= now) {
            xm_held *f = line_take(l, 0);
            h->port_line_late_ns[port] += now - f->due;
            port_send(h, port, f->data, f->len);
            free(f);
        }
    }
    return 0; /* the caller looks at failed */
}

/* Dataplane._loop's passes in one call: wait (poll) for frames on the ports, for the wake
 * pipe, or until the next departure, with the switch's lock (a pthread mutex: testbed/switch/
 * native/lock.py) released; then, holding it, read each port with frames and serve the
 * queues. Returns to Python, the lock released: when the wake pipe has something (a packet
 * handed in, a stop), at until_ns of CLOCK_MONOTONIC (the loop's housekeeping), when the
 * switch's path is no longer the hop's (fast cleared: a program loaded) or a callback
 * failed: 0; -errno when a port's read (py_handle: the port) or the poll failed. */
int64_t xm_emu_loop(xm_loop *L, int64_t node, uint64_t mutex, const int64_t *ports,
                    int64_t nports, int64_t wake_fd, int64_t start_ns, int64_t offset_ns,
                    int64_t until_ns)
{
    xm_hop *h = &L->hops[node];
    pthread_mutex_t *m = (pthread_mutex_t *)(uintptr_t)mutex;
    struct pollfd fds[NPORTS + 1];
    if (nports > NPORTS) return -EINVAL;
    for (int64_t i = 0; i < nports; i++) {
        fds[i].fd = (int)h->fd[ports[i]];
        fds[i].events = POLLIN;
    }
    fds[nports].fd = (int)wake_fd;
    fds[nports].events = POLLIN;
    for (;;) {
        int64_t hard = 0, soft = 0, due = 0, held;
        pthread_mutex_lock(m);
        int fast = (int)h->fast;
        int have_hard = fast && xm_emu_next_due(L, node, 0, &hard);
        int have_soft = fast && xm_tm_next_departure((xm_tm *)(uintptr_t)h->tm, &soft);
        if (fast && xm_emu_next_due(L, node, 1, &held) && (!have_soft || held < soft)) {
            soft = held;
            have_soft = 1;
        }
        int64_t now = clock_ns(start_ns);
        int64_t plan = xm_emu_plan(have_hard, hard, have_soft, soft, h->slack_ns, now, &due);
        pthread_mutex_unlock(m);
        if (!fast) return 0;
        int64_t wait = until_ns - clock_ns(0);
        if (wait <= 0) return 0;
        if ((plan & 1) && due - now < wait) wait = due - now;
        /* to the nanosecond: a departure due in 0.3 ms leaves then, not at the next whole
         * millisecond (Python's poll takes milliseconds, rounded up) */
        if (wait < 0) wait = 0;
        struct timespec ts = {(time_t)(wait / 1000000000), (long)(wait % 1000000000)};
        /* a wait that ends within the slack wakes for the wake pipe alone; then one look
         * at every port says which to read */
        int n = (plan & 2) ? ppoll(fds, (nfds_t)(nports + 1), &ts, NULL)
                           : ppoll(&fds[nports], 1, &ts, NULL);
        if (n >= 0 && !(plan & 2)) {
            struct timespec zero = {0, 0};
            n = ppoll(fds, (nfds_t)(nports + 1), &zero, NULL);
        }
        if (n < 0) {
            if (errno == EINTR) continue;
            L->py_handle = -1; /* no port's: the poll's */
            return -errno;
        }
        pthread_mutex_lock(m);
        int64_t rc = 0;
        if (h->fast) {
            for (int64_t i = 0; i < nports && n > 0 && !L->failed; i++) {
                if (!fds[i].revents) continue;
                rc = xm_emu_read(L, node, ports[i], XM_RX_BATCH, start_ns, offset_ns);
                if (rc < 0) {
                    L->py_handle = ports[i];
                    break;
                }
            }
            if (rc >= 0 && !L->failed) xm_emu_service(L, node, start_ns);
        }
        pthread_mutex_unlock(m);
        if (rc < 0) return rc;
        if (L->failed || !h->fast || (n > 0 && fds[nports].revents)) return 0;
    }
}

/* run events in order until a Python one is next (RUN_PYTHON, RUN_DELIVER), none is left
 * (RUN_EMPTY), the next is after until (RUN_UNTIL; until < 0: no bound) or a callback
 * raised (RUN_FAILED) */
int64_t xm_loop_run(xm_loop *L, int64_t until)
{
    free(L->py_block);
    L->py_block = NULL;
    while (L->n) {
        xm_ev *top = L->heap;
        if (until >= 0 && top->t > until) {
            L->now = until;
            return XM_RUN_UNTIL;
        }
        xm_ev e = pop(L);
        L->now = e.t;
        L->events++;
        switch (e.kind) {
        case XM_EV_PY:
            L->py_handle = e.a;
            return XM_RUN_PYTHON;
        case XM_EV_DELIVER: {
            xm_block *b = e.block;
            int64_t code = 1; /* host_native.c's XM_HOST_WHOLE: the target's, in Python */
            if (e.node >= 0 && e.node < L->nhosts && L->hosts[e.node])
                code = L->host_rx(L->hosts[e.node], b->data, b->len, L->now);
            if (!code) {
                free(b);
                break;
            }
            L->py_data = b->data;
            L->py_len = b->len;
            L->py_block = b;
            if (code == 1) {
                L->py_handle = e.a;
                return XM_RUN_DELIVER;
            }
            L->py_handle = e.node;
            L->py_code = code;
            return XM_RUN_HOST;
        }
        case XM_EV_RX:
            hop_receive(L, e.node, e.a, e.block);
            break;
        case XM_EV_SERVICE:
            hop_service(L, e.node, e.a);
            break;
        default: { /* a C host's */
            int64_t code = L->host_event(L->hosts[e.node], e.kind - XM_EV_HOST, e.a, L->now);
            if (code) {
                L->py_handle = e.node;
                L->py_code = code;
                L->py_data = NULL;
                L->py_len = 0;
                return XM_RUN_HOST;
            }
        }
        }
        if (L->failed) return XM_RUN_FAILED;
    }
    if (until >= 0 && L->now < until) L->now = until;
    return XM_RUN_EMPTY;
}
"""


def _fill(text: str) -> str:
    return (
        text.replace("NPORTS", str(_NPORTS))
        .replace("RX_BATCH_VALUE", str(RX_BATCH))
        .replace("LINE_MAX_BYTES_VALUE", str(LINE_MAX_BYTES))
        .replace("STAMP_BYTES_VALUE", str(STAMP.size))
        .replace("STAMP_MAGIC_VALUE", hex(STAMP_MAGIC))
        .replace("ETH_HEADER_VALUE", str(ETH_HEADER))
    )


def source() -> str:
    """The loop's C, to follow the architecture's common path in a generated source."""
    return "/* ---- the twin's loop and switch hops (testbed/switch/native/hop.py) ---- */\n" + (
        _fill(_STRUCTS) + _fill(_C)
    )


def cdef() -> str:
    return _fill(_STRUCTS) + _FUNCS
