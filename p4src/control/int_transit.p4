/*
 * INT transit.
 * Ingress (IntIngressCheck): completes the parser's verdict on INT packets (a packet whose INT
 * extraction stopped part-way is truncated or runs past its end; the stack must fit the UDP
 * length; Hop ML must be the size the instruction bitmap asks for) and counts every verdict in
 * int_status. Only INT_OK packets get INT processing anywhere; the rest are forwarded as they
 * came.
 * Egress (IntTransitEgress): pushes this hop's record on top of the stack per the instruction
 * bitmap (all-ones for what the switch cannot give), decrements RemainingHopCnt, updates the
 * shim, IPv4 and UDP lengths; sets the E bit instead when the hop budget is spent and the M
 * bit instead when the record would not fit the egress port's MTU.
 */
#ifndef XINGMAI_INT_TRANSIT_P4
#define XINGMAI_INT_TRANSIT_P4

#include "int_common.p4"

control IntIngressCheck(inout headers_t hdr, inout local_md_t md) {
    COUNTER(int_status, INT_STATUS_COUNT);
    IntHopWords() hop_words;

    // UDP header + shim + MD header and stack: (2 + 1 + shim length) words.
    @hidden action set_udp_int_bytes(bit<16> bytes) { md.calc.int_bytes_udp = bytes; }
#define UDP_INT_BYTES(n) set_udp_int_bytes(((n) + 3) * 4)
    @hidden table udp_int_lengths {
        key = { hdr.int_shim.len: exact; }
        actions = { set_udp_int_bytes; }
        const default_action = set_udp_int_bytes(0);
        const entries = { INT_SHIM_LENGTHS(UDP_INT_BYTES) }
    }
    @hidden action udp_short() { md.calc.udp_short = md.calc.int_bytes_udp |-| hdr.udp.len; }
    @hidden action hop_ml_16() { md.calc.hop_words = (bit<16>)hdr.int_md.hop_ml; }

    apply {
        if (hdr.udp.isValid() && hdr.ipv4.dscp == INT_DSCP) {
            if (md.int_status == INT_NONE) {
                // The parser saw the INT DSCP but did not finish: the packet ended inside the
                // shim or MD header, or before the stack the shim length announces.
                if (hdr.int_md.isValid()) {
                    md.int_status = INT_LEN_PAST_END;
                } else {
                    md.int_status = INT_TRUNCATED;
                }
            } else if (md.int_status == INT_OK) {
                hop_words.apply(hdr.int_md.instruction_bitmap, md.calc.md_words);
                udp_int_lengths.apply();
                hop_ml_16();
                udp_short();
                if (md.calc.udp_short != 0) {
                    md.int_status = INT_LEN_PAST_END;
                } else if (md.calc.hop_words != md.calc.md_words) {
                    md.int_status = INT_BAD_HOP_ML;
                }
            }
            COUNT(int_status, md.int_status);
        }
    }
}

// What transit decides, computed for every packet before the INT branch of egress (on
// Tofino 1, with no long branches, tables inside a branch take stages of their own): the
// record's size, the lengths after the push, and whether the hop budget, the MTU and the shim
// length allow it. A packet the source inserts INT into in this pass (IntSourcePrepare) is
// taken as the source will leave it; any other INT packet as it arrived.
control IntTransitPrepare(inout headers_t hdr, inout local_md_t md) {
    // The record size in words and bytes from a constant table on Hop ML, for both cases
    // (widening the 5-bit field in an action would tie its PHV slicing to every length it is
    // added to).
    @hidden action received_size(bit<8> words, bit<16> bytes) {
        md.calc.rx_hop_ml = words;
        md.calc.rx_bytes = bytes;
    }
#define RECEIVED_SIZE(n) received_size(n, 4 * (n))
    @hidden table received_sizes {
        key = { hdr.int_md.hop_ml: exact; }
        actions = { received_size; }
        const default_action = received_size(0, 0);
        const entries = {
            INT_HOP_ML_VALUES(RECEIVED_SIZE)
        }
    }
    @hidden action sourced_size(bit<8> words, bit<16> bytes) {
        md.calc.src_hop_ml = words;
        md.calc.src_bytes = bytes;
    }
#define SOURCED_SIZE(n) sourced_size(n, 4 * (n))
    @hidden table sourced_sizes {
        key = { md.calc.md_words: exact; }
        actions = { sourced_size; }
        const default_action = sourced_size(0, 0);
        const entries = {
            INT_HOP_ML_VALUES(SOURCED_SIZE)
        }
    }

    // The INT headers transit works on: the source's (this pass inserts them), the packet's
    // (a valid INT packet), or none. A keyed table, not a condition.
    @hidden action as_sourced() {
        md.calc.transit = 1;
        md.calc.hop_ml = md.calc.src_hop_ml;
        md.calc.int_bytes_ip = md.calc.src_bytes;
        md.calc.int_bytes_udp = md.calc.src_bytes;
        md.calc.base_len = md.calc.src_len_after;
        md.calc.base_udp_len = hdr.udp.len + INT_HEADERS_BYTES;
        md.calc.shim_len = INT_MD_WORDS;
        md.calc.remaining = md.int_source_hop_budget;
        md.calc.bitmap = md.int_source_bitmap;
    }
    @hidden action as_received() {
        md.calc.transit = 1;
        md.calc.hop_ml = md.calc.rx_hop_ml;
        md.calc.int_bytes_ip = md.calc.rx_bytes;
        md.calc.int_bytes_udp = md.calc.rx_bytes;
        md.calc.base_len = hdr.ipv4.total_len;
        md.calc.base_udp_len = hdr.udp.len;
        md.calc.shim_len = hdr.int_shim.len;
        md.calc.remaining = hdr.int_md.remaining_hop_cnt;
        md.calc.bitmap = hdr.int_md.instruction_bitmap;
    }
    @hidden action no_transit() { md.calc.transit = 0; }
    @hidden table transit_input {
        key = {
            md.int_source: ternary;
            md.int_sink: ternary;
            hdr.udp.isValid(): ternary;
            hdr.int_shim.isValid(): ternary;
            hdr.int_md.isValid(): ternary;
            md.int_status: ternary;
            md.calc.src_mtu_over: ternary;
        }
        actions = { as_sourced; as_received; no_transit; }
        const default_action = no_transit();
        const entries = {
            // (IntSourceEgress inserts: a watched UDP packet without INT, within the MTU)
            (1, 0, true, false, _, _, 0): as_sourced();
            (_, _, true, true, true, INT_OK, _): as_received();
        }
    }

    // The lengths after a push, one step per action (a Tofino ALU adds aligned operands: each
    // length field gets its own copy of the record size). The IPv4 length saturates at NO_MTU.
    @hidden action lengths_after() {
        md.calc.len_after = md.calc.base_len |+| md.calc.int_bytes_ip;
        md.calc.udp_len_after = md.calc.base_udp_len + md.calc.int_bytes_udp;
        md.calc.shim_room = 255 - md.calc.shim_len;
        md.calc.shim_len_after = md.calc.shim_len + md.calc.hop_ml;
    }
    @hidden action overs() {
        md.calc.mtu_over = md.calc.len_after |-| md.mtu;
        md.calc.room_over = md.calc.hop_ml |-| md.calc.shim_room;
    }

    apply {
        received_sizes.apply();
        sourced_sizes.apply();
        transit_input.apply();
        lengths_after();
        overs();
    }
}

// The push (after IntTransitPrepare and IntSourceEgress), in the egress branch of normal
// packets.
control IntTransitEgress(inout headers_t hdr, inout local_md_t md) {
    COUNTER(int_transit_events, INT_EVENTS_SIZE);

    // This hop's record, per instruction bit (bit 0 = the bitmap's MSB). Bit 6: no logical
    // (L2) ports on this switch; bits 8-15 (shared buffer occupancy, reserved bits, checksum
    // complement): not available here. All-ones is "not available".
#define PUSH_NODE_ID                                                            \
    hdr.int_hop.node_id.setValid();                                             \
    hdr.int_hop.node_id.node_id = md.node_id;
#define PUSH_L1_PORT_IDS                                                        \
    hdr.int_hop.l1_port_ids.setValid();                                         \
    hdr.int_hop.l1_port_ids.ingress_port_id = md.calc.ingress_port_16;          \
    hdr.int_hop.l1_port_ids.egress_port_id = md.calc.egress_port_16;
#define PUSH_HOP_LATENCY                                                        \
    hdr.int_hop.hop_latency.setValid();                                         \
    hdr.int_hop.hop_latency.hop_latency = (bit<32>)md.egress_ts - (bit<32>)md.ingress_ts;
#define PUSH_Q_OCCUPANCY hdr.int_hop.q_occupancy.setValid();  /* PortTelemetryExport */
#define PUSH_INGRESS_TSTAMP                                                     \
    hdr.int_hop.ingress_tstamp.setValid();                                      \
    hdr.int_hop.ingress_tstamp.ns = md.ingress_ts;
#define PUSH_EGRESS_TSTAMP                                                      \
    hdr.int_hop.egress_tstamp.setValid();                                       \
    hdr.int_hop.egress_tstamp.ns = md.egress_ts;
#define PUSH_L2_PORT_IDS                                                        \
    hdr.int_hop.l2_port_ids.setValid();                                         \
    hdr.int_hop.l2_port_ids.ingress_port_id = 0xFFFFFFFF;                       \
    hdr.int_hop.l2_port_ids.egress_port_id = 0xFFFFFFFF;
#define PUSH_TX_UTIL hdr.int_hop.tx_util.setValid();  /* PortTelemetryExport */
#define PUSH_ONES(w) hdr.int_hop.w.setValid(); hdr.int_hop.w.value = 0xFFFFFFFF;
#define PUSH_BUFFER PUSH_ONES(buffer)
#define PUSH_RSVD9 PUSH_ONES(rsvd9)
#define PUSH_RSVD10 PUSH_ONES(rsvd10)
#define PUSH_RSVD11 PUSH_ONES(rsvd11)
#define PUSH_RSVD12 PUSH_ONES(rsvd12)
#define PUSH_RSVD13 PUSH_ONES(rsvd13)
#define PUSH_RSVD14 PUSH_ONES(rsvd14)
#define PUSH_CHECKSUM PUSH_ONES(checksum)
    NIBBLE_TABLE(fill_0_3, md.calc.bitmap, 12, PUSH_NODE_ID, PUSH_L1_PORT_IDS,
                 PUSH_HOP_LATENCY, PUSH_Q_OCCUPANCY)
    NIBBLE_TABLE(fill_4_7, md.calc.bitmap, 8, PUSH_INGRESS_TSTAMP, PUSH_EGRESS_TSTAMP,
                 PUSH_L2_PORT_IDS, PUSH_TX_UTIL)
    NIBBLE_TABLE(fill_8_11, md.calc.bitmap, 4, PUSH_BUFFER, PUSH_RSVD9, PUSH_RSVD10, PUSH_RSVD11)
    NIBBLE_TABLE(fill_12_15, md.calc.bitmap, 0, PUSH_RSVD12, PUSH_RSVD13, PUSH_RSVD14,
                 PUSH_CHECKSUM)

    apply {
        if (md.calc.transit == 1) {
            if (md.calc.remaining == 0) {
                hdr.int_md.e = 1;
                COUNT(int_transit_events, INT_TRANSIT_E_BIT);
            } else if (md.calc.mtu_over != 0 || md.calc.room_over != 0) {
                // No room: in the port's MTU, or in the 8-bit shim length.
                hdr.int_md.m = 1;
                COUNT(int_transit_events, INT_TRANSIT_M_BIT);
            } else {
                fill_0_3.apply();
                fill_4_7.apply();
                fill_8_11.apply();
                fill_12_15.apply();
                hdr.int_md.remaining_hop_cnt = md.calc.remaining - 1;
                hdr.int_shim.len = md.calc.shim_len_after;
                hdr.ipv4.total_len = md.calc.len_after;
                hdr.udp.len = md.calc.udp_len_after;
                hdr.udp.checksum = 0;
                COUNT(int_transit_events, INT_TRANSIT_PUSHED);
            }
        }
    }
}

#endif
