/*
 * Port telemetry and counters.
 * Ingress: packets/bytes received per port, and dropped per reason (DROP_*).
 * Egress: packets/bytes sent per port; tx utilization per port over aligned windows of
 * 2^md.tx_util_shift ns (switch_config; ppm of the port speed, the last complete window: a
 * packet that opens a new window turns the previous window's byte count into utilization, or 0
 * when one or more whole windows passed without traffic); and each port's latest hop latency, queue
 * occupancy and egress time, which a telemetry report reads for the sink port.
 *
 * Every register cell is changed by one named read-modify-write (REG_ACTION, the shape of
 * Tofino's RegisterAction): a packet reads or updates each register once, at one index: its
 * egress port, or for a report clone the sink port (read only).
 */
#ifndef XINGMAI_PORT_TELEMETRY_P4
#define XINGMAI_PORT_TELEMETRY_P4

control PortTelemetryIngress(inout headers_t hdr, inout local_md_t md) {
    COUNTER(port_rx, PORT_SPACE);
    COUNTER(drops, DROP_REASONS);

    apply {
        COUNT(port_rx, md.ingress_port);
        if (md.drop == 1) {
            COUNT(drops, md.drop_reason);
        }
    }
}

control PortTelemetryEgress(inout headers_t hdr, inout local_md_t md) {
    COUNTER(port_tx, PORT_SPACE);
    REGISTER(bit<32>, tx_window, PORT_SPACE);        // window number of the bytes below
    REGISTER(bit<32>, tx_window_bytes, PORT_SPACE);
    REGISTER(bit<32>, tx_util_last, PORT_SPACE);     // ppm over the window before that one
    REGISTER(bit<32>, tx_util_mult_last, PORT_SPACE);
    REGISTER(bit<32>, last_hop_latency, PORT_SPACE);
    REGISTER(bit<32>, last_queue, PORT_SPACE);       // queue id + occupancy, as in INT
    // (a stateful ALU is 32 bits wide: the 64-bit egress time is kept in two halves)
    REGISTER(bit<32>, last_egress_ts_hi, PORT_SPACE);
    REGISTER(bit<32>, last_egress_ts_lo, PORT_SPACE);

    // One conversion of bytes to utilization per packet: its own port's window for a packet,
    // the sink port's for a report clone.
    MulShr16() bytes_to_util;
    TimeWindow() time_window;

    // What the register bodies below read besides the cell (set before they run).
    bit<32> window = 0;          // the window this packet leaves in
    bit<32> hop_latency = 0;
    bit<32> queue = 0;
    // The port's stored window, its bytes and multiplier; the gap between the stored window
    // and this packet's, computed by an action of its own (a Tofino gateway tests a field, not
    // an expression); the stored window's utilization.
    bit<32> stored_window = 0;
    bit<32> stored_bytes = 0;
    bit<32> mult = 0;
    bit<32> gap = 0;
    bit<32> util = 0;
    @hidden action window_gap() { gap = window - stored_window; }

    // tx_window: the port's current window number.
    REG_ACTION(tx_window, bit<32>, bit<32>, tx_window_update,
        rv = value;
        value = window;)
    REG_ACTION(tx_window, bit<32>, bit<32>, tx_window_read,
        rv = value;)
    // tx_window_bytes: bytes sent in that window; a new window starts with this packet.
    REG_ACTION(tx_window_bytes, bit<32>, bit<32>, tx_bytes_add,
        rv = value;
        value = value + md.pkt_len;)
    REG_ACTION(tx_window_bytes, bit<32>, bit<32>, tx_bytes_restart,
        rv = value;
        value = md.pkt_len;)
    REG_ACTION(tx_window_bytes, bit<32>, bit<32>, tx_bytes_read,
        rv = value;)
    // tx_util_mult_last: the multiplier the port's bytes are counted under (a report clone
    // turns the sink port's bytes into utilization with it).
    REG_ACTION(tx_util_mult_last, bit<32>, bit<32>, tx_mult_update,
        value = md.tx_util_mult;
        rv = value;)
    REG_ACTION(tx_util_mult_last, bit<32>, bit<32>, tx_mult_read,
        rv = value;)
    // tx_util_last: utilization of the last complete window, replaced when a window ends.
    REG_ACTION(tx_util_last, bit<32>, bit<32>, tx_util_read,
        rv = value;)
    REG_ACTION(tx_util_last, bit<32>, bit<32>, tx_util_replace,
        value = util;
        rv = value;)
    // The latest packet's measurements, for the sink's reports.
    REG_ACTION(last_hop_latency, bit<32>, bit<32>, last_hop_latency_write,
        value = hop_latency;
        rv = value;)
    REG_ACTION(last_hop_latency, bit<32>, bit<32>, last_hop_latency_read,
        rv = value;)
    REG_ACTION(last_queue, bit<32>, bit<32>, last_queue_write,
        value = queue;
        rv = value;)
    REG_ACTION(last_queue, bit<32>, bit<32>, last_queue_read,
        rv = value;)
    REG_ACTION(last_egress_ts_hi, bit<32>, bit<32>, last_egress_ts_hi_write,
        value = md.egress_ts[63:32];
        rv = value;)
    REG_ACTION(last_egress_ts_hi, bit<32>, bit<32>, last_egress_ts_hi_read,
        rv = value;)
    REG_ACTION(last_egress_ts_lo, bit<32>, bit<32>, last_egress_ts_lo_write,
        value = md.egress_ts[31:0];
        rv = value;)
    REG_ACTION(last_egress_ts_lo, bit<32>, bit<32>, last_egress_ts_lo_read,
        rv = value;)

    apply {
        COUNT(port_tx, md.egress_port);
        time_window.apply(md.egress_ts, md.tx_util_shift, window);

        // A register is accessed once per packet (as on Tofino): a report clone reads the
        // sink port's state and leaves it unchanged; it is not counted into its own port's
        // window. Every other packet updates its egress port's state.
        if (md.pkt_kind == PKT_INGRESS_CLONE && md.report == 1) {
            port_t sink = md.report_sink_port;
            REG_EXEC(tx_window_read, sink, stored_window);
            REG_EXEC(tx_bytes_read, sink, stored_bytes);
            REG_EXEC(tx_mult_read, sink, mult);
            window_gap();
        } else {
            port_t port = md.egress_port;
            REG_EXEC(tx_window_update, port, stored_window);
            window_gap();
            if (gap == 0) {
                REG_EXEC(tx_bytes_add, port, stored_bytes);
            } else {
                REG_EXEC(tx_bytes_restart, port, stored_bytes);
            }
            REG_EXEC(tx_mult_update, port, mult);
        }

        // The stored window's utilization: current when the packet is in it; when it ended
        // just before the packet's window, its bytes under its multiplier; 0 when whole
        // windows passed without traffic.
        if (gap == 1) {
            bytes_to_util.apply(stored_bytes, mult, util);
        }

        if (md.pkt_kind == PKT_INGRESS_CLONE && md.report == 1) {
            port_t sink = md.report_sink_port;
            if (gap == 0) {
                REG_EXEC(tx_util_read, sink, md.sink_tx_util);
            } else {
                md.sink_tx_util = util;
            }
            REG_EXEC(last_hop_latency_read, sink, md.sink_hop_latency);
            REG_EXEC(last_queue_read, sink, md.sink_queue);
            REG_EXEC(last_egress_ts_hi_read, sink, md.sink_egress_ts[63:32]);
            REG_EXEC(last_egress_ts_lo_read, sink, md.sink_egress_ts[31:0]);
        } else {
            port_t port = md.egress_port;
            if (gap == 0) {
                REG_EXEC(tx_util_read, port, md.tx_util);
            } else {
                REG_EXEC(tx_util_replace, port, md.tx_util);
            }
            if (md.pkt_kind == PKT_NORMAL) {
                hop_latency = (bit<32>)md.egress_ts - (bit<32>)md.ingress_ts;
                queue = md.qid ++ md.q_occupancy;
                REG_RUN(last_hop_latency_write, port);
                REG_RUN(last_queue_write, port);
                REG_RUN(last_egress_ts_hi_write, port);
                REG_RUN(last_egress_ts_lo_write, port);
            }
        }
    }
}

#endif
