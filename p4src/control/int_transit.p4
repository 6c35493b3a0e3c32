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

control IntTransitEgress(inout headers_t hdr, inout local_md_t md) {
    COUNTER(int_transit_events, INT_EVENTS_SIZE);
    UnlinkedCopy16() bitmap_copy;

    // The lengths after a push, one step per action (a Tofino ALU adds aligned operands: each
    // length field gets its own copy of the record size). The IPv4 length saturates at NO_MTU.
    // The record size in words and bytes comes from a constant table on Hop ML: widening the
    // 5-bit field in an action would tie its PHV slicing to every length it is added to.
    @hidden action record_size(bit<8> words, bit<16> bytes) {
        md.calc.hop_ml = words;
        md.calc.int_bytes_ip = bytes;
        md.calc.int_bytes_udp = bytes;
    }
    @hidden table record_sizes {
        key = { hdr.int_md.hop_ml: exact; }
        actions = { record_size; }
        const default_action = record_size(0, 0);
        const entries = {
            0: record_size(0, 0); 1: record_size(1, 4); 2: record_size(2, 8); 3: record_size(3,
            12); 4: record_size(4, 16); 5: record_size(5, 20); 6: record_size(6, 24); 7:
            record_size(7, 28); 8: record_size(8, 32); 9: record_size(9, 36); 10:
            record_size(10, 40); 11: record_size(11, 44); 12: record_size(12, 48); 13:
            record_size(13, 52); 14: record_size(14, 56); 15: record_size(15, 60); 16:
            record_size(16, 64); 17: record_size(17, 68); 18: record_size(18, 72); 19:
            record_size(19, 76); 20: record_size(20, 80); 21: record_size(21, 84); 22:
            record_size(22, 88); 23: record_size(23, 92); 24: record_size(24, 96); 25:
            record_size(25, 100); 26: record_size(26, 104); 27: record_size(27, 108); 28:
            record_size(28, 112); 29: record_size(29, 116); 30: record_size(30, 120); 31:
            record_size(31, 124);
        }
    }
    @hidden action shim_room() { md.calc.shim_room = 255 - hdr.int_shim.len; }
    @hidden action overs() {
        md.calc.mtu_over = md.calc.len_after |-| md.mtu;
        md.calc.room_over = md.calc.hop_ml |-| md.calc.shim_room;
    }
    @hidden action lengths_after() {
        md.calc.len_after = hdr.ipv4.total_len |+| md.calc.int_bytes_ip;
        md.calc.udp_len_after = hdr.udp.len + md.calc.int_bytes_udp;
    }

    // This hop's record, per instruction bit (bit 0 = the bitmap's MSB). Bit 6: no logical
    // (L2) ports on this switch; bits 8-15 (shared buffer occupancy, reserved bits, checksum
    // complement): not available here. All-ones is "not available".
    bit<16> bm = 0;
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
    NIBBLE_TABLE(fill_0_3, bm, 12, PUSH_NODE_ID, PUSH_L1_PORT_IDS, PUSH_HOP_LATENCY,
                 PUSH_Q_OCCUPANCY)
    NIBBLE_TABLE(fill_4_7, bm, 8, PUSH_INGRESS_TSTAMP, PUSH_EGRESS_TSTAMP, PUSH_L2_PORT_IDS,
                 PUSH_TX_UTIL)
    NIBBLE_TABLE(fill_8_11, bm, 4, PUSH_BUFFER, PUSH_RSVD9, PUSH_RSVD10, PUSH_RSVD11)
    NIBBLE_TABLE(fill_12_15, bm, 0, PUSH_RSVD12, PUSH_RSVD13, PUSH_RSVD14, PUSH_CHECKSUM)

    apply {
        if (md.int_status == INT_OK && hdr.int_shim.isValid() && hdr.int_md.isValid()) {
            bitmap_copy.apply(hdr.int_md.instruction_bitmap, bm);
            record_sizes.apply();
            shim_room();
            lengths_after();
            overs();
            if (hdr.int_md.remaining_hop_cnt == 0) {
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
                hdr.int_md.remaining_hop_cnt = hdr.int_md.remaining_hop_cnt - 1;
                hdr.int_shim.len = hdr.int_shim.len + md.calc.hop_ml;
                hdr.ipv4.total_len = md.calc.len_after;
                hdr.udp.len = md.calc.udp_len_after;
                hdr.udp.checksum = 0;
                COUNT(int_transit_events, INT_TRANSIT_PUSHED);
            }
        }
    }
}

#endif
