/*
 * Port telemetry and counters.
 * Ingress: packets/bytes received per port, and dropped per reason (DROP_*).
 * Egress: packets/bytes sent per port; tx utilization per port over aligned windows of
 * 2^md.tx_util_shift ns (switch_config; ppm of the port speed over the last complete window:
 * every packet adds its bytes, already scaled to ppm, to its window's load, and the packet that
 * opens a new window keeps the previous window's load as the port's utilization, or 0 when one
 * or more whole windows passed without traffic); and each port's latest hop latency, queue
 * occupancy, egress time and utilization, which a telemetry report reads for the sink port.
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
    REGISTER(bit<32>, tx_window, PORT_SPACE);        // window number of the load below
    REGISTER(bit<32>, tx_window_load, PORT_SPACE);   // load so far in that window
    REGISTER(bit<32>, tx_util_last, PORT_SPACE);     // load of the window before that one
    REGISTER(bit<32>, last_hop_latency, PORT_SPACE);
    REGISTER(bit<32>, last_queue, PORT_SPACE);       // queue id + occupancy, as in INT
    // (a stateful ALU is 32 bits wide: the 64-bit egress time is kept in two halves)
    REGISTER(bit<32>, last_egress_ts_hi, PORT_SPACE);
    REGISTER(bit<32>, last_egress_ts_lo, PORT_SPACE);

    // Each packet's share of its window's utilization, computed beside the window lookup, not
    // after it: load = bytes * tx_util_mult >> TX_LOAD_FRACTION_BITS, i.e. ppm with that many
    // fraction bits, so that the sum over a window is the window's utilization (truncated per
    // packet by less than 2^-8 ppm) and a window's end needs no multiplication.
    MulShr8() packet_load;
    TimeWindow() time_window;
    QueueBytes() deq_bytes;

    // What the register bodies below read besides the cell (set before they run).
    port_t port = 0;             // the port whose state the packet updates, or reads
    bit<1> reading = 0;          // a report clone: reads the sink port's state
    bit<32> bytes = 0;           // what the packet adds to the port's window (a report: 0)
    bit<32> load = 0;
    bit<32> window = 0;          // the window this packet leaves in
    bit<32> hop_latency = 0;
    bit<32> queue = 0;
    // Windows since the port's stored one (0: the same window, and for a report), and that
    // window's load.
    bit<32> gap = 0;
    bit<32> stored_load = 0;

    // Each register has one read-modify-write, which branches on what the packet is (a
    // Tofino stateful ALU tests its inputs): one table per register for every packet, no
    // condition around them (on Tofino 1, with no long branches, a chain of tables inside a
    // condition takes stages of its own).
    // tx_window: the port's current window number; the packet gets the gap (a report: 0).
    REG_ACTION(tx_window, bit<32>, bit<32>, tx_window_update,
        if (reading == 0) {
            rv = window - value;
            value = window;
        } else {
            rv = 0;
        })
    // tx_window_load: the window's load; a new window starts with this packet's.
    REG_ACTION(tx_window_load, bit<32>, bit<32>, tx_load_update,
        rv = value;
        if (gap == 0) {
            value = value + load;
        } else {
            value = load;
        })
    // tx_util_last: the load of the last complete window; replaced when a window ends (by 0
    // when whole windows passed without traffic), read otherwise.
    REG_ACTION(tx_util_last, bit<32>, bit<32>, tx_util_update,
        if (gap == 1) {
            value = stored_load;
        } else if (gap != 0) {
            value = 0;
        }
        rv = value;)
    // The latest packet's measurements, for the sink's reports.
    REG_ACTION(last_hop_latency, bit<32>, bit<32>, last_hop_latency_access,
        if (reading == 0) {
            value = hop_latency;
        }
        rv = value;)
    REG_ACTION(last_queue, bit<32>, bit<32>, last_queue_access,
        if (reading == 0) {
            value = queue;
        }
        rv = value;)
    REG_ACTION(last_egress_ts_hi, bit<32>, bit<32>, last_egress_ts_hi_access,
        if (reading == 0) {
            value = md.egress_ts[63:32];
        }
        rv = value;)
    REG_ACTION(last_egress_ts_lo, bit<32>, bit<32>, last_egress_ts_lo_access,
        if (reading == 0) {
            value = md.egress_ts[31:0];
        }
        rv = value;)

    // INT's 24-bit occupancy, saturated below all-ones (which would read as "not available"),
    // without a branch: the saturating sum reaches all-ones exactly when the depth is 0xFFFFFE
    // or more, and its low 24 bits less 1 are then 0xFFFFFE, the depth otherwise.
    @hidden action occupancy_sat() {
        md.calc.occupancy_sat = md.deq_qdepth_bytes |+| 0xFF000001;
    }
    @hidden action occupancy() { md.q_occupancy = md.calc.occupancy_sat[23:0] - 1; }

    @hidden action read_sink() {
        reading = 1;
        port = md.report_sink_port;
        bytes = 0;
    }
    @hidden action own_port() {
        port = md.egress_port;
        bytes = md.pkt_len;
    }
    @hidden action measurements() {
        hop_latency = (bit<32>)md.egress_ts - (bit<32>)md.ingress_ts;
        queue = md.qid ++ md.q_occupancy;
    }

    // A report clone reads the sink port's state, as the sink port's last packet left it (its
    // own port's windows do not count it); every other packet updates its egress port's.
    @hidden table telemetry_port {
        key = {
            md.pkt_kind: exact;
            md.report: exact;
        }
        actions = { read_sink; own_port; }
        const default_action = own_port();
        const entries = { (PKT_INGRESS_CLONE, 1): read_sink(); }
    }

    apply {
        COUNT(port_tx, md.egress_port);
        // The queue the packet left behind, in bytes, for INT (PortTelemetryExport) and the
        // sink port's reports. (Converted here, where it is used: on Tofino 1 a value computed
        // before a block of tables that does not need it holds that block back.)
        deq_bytes.apply(md.deq_qdepth, md.qdepth_unit, md.deq_qdepth_bytes);
        occupancy_sat();
        occupancy();
        measurements();

        telemetry_port.apply();
        time_window.apply(md.egress_ts_10, md.tx_util_shift, window);
        packet_load.apply(bytes, md.tx_util_mult, load);
        REG_EXEC(tx_window_update, port, gap);
        REG_EXEC(tx_load_update, port, stored_load);
        REG_EXEC(tx_util_update, port, md.tx_load);
        REG_EXEC(last_hop_latency_access, port, md.last_hop_latency);
        REG_EXEC(last_queue_access, port, md.last_queue);
        REG_EXEC(last_egress_ts_hi_access, port, md.last_egress_ts[63:32]);
        REG_EXEC(last_egress_ts_lo_access, port, md.last_egress_ts[31:0]);
    }
}

// The port telemetry a packet carries, into the headers the INT branches made valid: the
// egress queue and port utilization in this hop's INT record, and the sink port's latest
// measurements in a report. Written after the measurements, not in those branches: on Tofino 1
// (no long branches) a value that a table inside a branch reads holds the whole branch back
// until the stage of the tables that write it.
control PortTelemetryExport(inout headers_t hdr, inout local_md_t md) {
    apply {
        if (hdr.int_hop.q_occupancy.isValid()) {
            // (this packet's queue as last_queue holds it: one source for the header's word)
            hdr.int_hop.q_occupancy.q_id = md.last_queue[31:24];
            hdr.int_hop.q_occupancy.q_occupancy = md.last_queue[23:0];
        }
        if (hdr.int_hop.tx_util.isValid()) {
            hdr.int_hop.tx_util.tx_util = md.tx_load >> TX_LOAD_FRACTION_BITS;
        }
        if (hdr.report_md.hop_latency.isValid()) {
            hdr.report_md.hop_latency.hop_latency = md.last_hop_latency;
        }
        if (hdr.report_md.q_occupancy.isValid()) {
            hdr.report_md.q_occupancy.q_id = md.last_queue[31:24];
            hdr.report_md.q_occupancy.q_occupancy = md.last_queue[23:0];
        }
        if (hdr.report_md.egress_tstamp.isValid()) {
            hdr.report_md.egress_tstamp.ns = md.last_egress_ts;
        }
        if (hdr.report_md.tx_util.isValid()) {
            hdr.report_md.tx_util.tx_util = md.tx_load >> TX_LOAD_FRACTION_BITS;
        }
    }
}

#endif
