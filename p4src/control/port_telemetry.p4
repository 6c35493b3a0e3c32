/*
 * Port telemetry and counters.
 * Ingress: packets/bytes received per port, and dropped per reason (DROP_*).
 * Egress: packets/bytes sent per port; tx utilization per port over aligned windows of
 * 2^md.tx_util_shift ns (switch_config; ppm of the port speed, the last complete window: a
 * packet that opens a new window turns the previous window's byte count into utilization, or 0
 * when one or more whole windows passed without traffic); and each port's latest hop latency, queue
 * occupancy and egress time, which a telemetry report reads for the sink port.
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
    REGISTER(bit<64>, last_egress_ts, PORT_SPACE);

    apply {
        COUNT(port_tx, md.egress_port);
        bit<32> window = (bit<32>)(md.egress_ts >> md.tx_util_shift);

        if (md.report == 1) {
            // A report clone: the sink port's latest state, before this packet changes any.
            port_t sink = md.report_sink_port;
            bit<32> sink_window;
            bit<32> sink_bytes;
            bit<32> sink_mult;
            REG_READ(tx_window, sink, sink_window);
            REG_READ(tx_window_bytes, sink, sink_bytes);
            REG_READ(tx_util_last, sink, md.sink_tx_util);
            REG_READ(tx_util_mult_last, sink, sink_mult);
            if (sink_window + 1 == window) {
                md.sink_tx_util = (bit<32>)(((bit<64>)sink_bytes * (bit<64>)sink_mult) >> 16);
            } else if (sink_window != window) {
                md.sink_tx_util = 0;
            }
            REG_READ(last_hop_latency, sink, md.sink_hop_latency);
            REG_READ(last_queue, sink, md.sink_queue);
            REG_READ(last_egress_ts, sink, md.sink_egress_ts);
        }

        bit<32> last_window;
        bit<32> bytes;
        REG_READ(tx_window, md.egress_port, last_window);
        REG_READ(tx_window_bytes, md.egress_port, bytes);
        REG_READ(tx_util_last, md.egress_port, md.tx_util);
        if (window != last_window) {
            if (window == last_window + 1) {
                md.tx_util = (bit<32>)(((bit<64>)bytes * (bit<64>)md.tx_util_mult) >> 16);
            } else {
                md.tx_util = 0;
            }
            bytes = 0;
            REG_WRITE(tx_window, md.egress_port, window);
            REG_WRITE(tx_util_last, md.egress_port, md.tx_util);
        }
        REG_WRITE(tx_window_bytes, md.egress_port, bytes + md.pkt_len);
        REG_WRITE(tx_util_mult_last, md.egress_port, md.tx_util_mult);

        if (md.pkt_kind == PKT_NORMAL) {
            REG_WRITE(last_hop_latency, md.egress_port, (bit<32>)(md.egress_ts - md.ingress_ts));
            REG_WRITE(last_queue, md.egress_port, md.qid ++ md.q_occupancy);
            REG_WRITE(last_egress_ts, md.egress_port, md.egress_ts);
        }
    }
}

#endif
