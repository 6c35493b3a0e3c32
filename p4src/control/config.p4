/*
 * Switch-wide and per-port configuration read at egress, set by the controller:
 *  - switch_config (no key; the controller sets its default action): INT node id, Telemetry
 *    Report hardware id, and qdepth_unit, the bytes one unit of the target's queue depth stands
 *    for (1 where the target reports bytes, as the built-in switch with --queue-depth-unit
 *    bytes; a cell or packet size where it reports cells or packets, as bmv2), and
 *    tx_util_shift, the length of the tx utilization windows (2^shift ns) of every port: a
 *    window must hold several frames for the utilization to mean anything, and an emulated
 *    fabric runs its ports far slower than the hardware it models.
 *  - port_config: per egress port, the multiplier that turns bytes per window into tx
 *    utilization (from the port speed; p4src/README.md) and the IPv4 MTU INT must respect.
 * Queue depths are converted to bytes with qdepth_unit where they are used (QueueBytes, from
 * the shim: where the target's unit is fixed, as Tofino's cells, the shim uses it and
 * qdepth_unit is not needed): the enqueue depth by ECN, the dequeue depth by port telemetry.
 */
#ifndef XINGMAI_CONFIG_P4
#define XINGMAI_CONFIG_P4

control EgressConfig(inout headers_t hdr, inout local_md_t md) {
    action set_switch_config(bit<32> node_id, bit<6> hw_id, bit<32> qdepth_unit,
                             bit<8> tx_util_shift) {
        md.node_id = node_id;
        md.hw_id = hw_id;
        md.qdepth_unit = qdepth_unit;
        md.tx_util_shift = tx_util_shift;
    }

    table switch_config {
        actions = {
            set_switch_config;
        }
        default_action = set_switch_config(0, 0, 1, TX_UTIL_WINDOW_SHIFT);
        size = 1;  // no key: the default action is the configuration
    }

    action set_port_config(bit<32> tx_util_mult, bit<16> mtu) {
        md.tx_util_mult = tx_util_mult;
        md.mtu = mtu;
    }

    table port_config {
        key = {
            md.egress_port: exact @name("port");
        }
        actions = {
            set_port_config;
        }
        // (the default is the configuration of a port without an entry: set by the table, not
        // by assignments before it, which would be a stage of their own on Tofino)
        const default_action = set_port_config(0, NO_MTU);
        size = PORT_TABLE_SIZE;
    }

    // The ports as INT, reports and packet-ins carry them (16 bits), for every feature.
    @hidden action ports_16() {
        md.calc.ingress_port_16 = (bit<16>)md.ingress_port;
        md.calc.egress_port_16 = (bit<16>)md.egress_port;
        md.calc.sink_port_16 = (bit<16>)md.report_sink_port;
    }
    apply {
        ports_16();
        switch_config.apply();
        port_config.apply();
    }
}

#endif
