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

    apply {
        if (md.int_status == INT_OK && hdr.int_shim.isValid() && hdr.int_md.isValid()) {
            bit<16> bm;
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
                if ((bm & 0x8000) != 0) {
                    hdr.int_hop.node_id.setValid();
                    hdr.int_hop.node_id.node_id = md.node_id;
                }
                if ((bm & 0x4000) != 0) {
                    hdr.int_hop.l1_port_ids.setValid();
                    hdr.int_hop.l1_port_ids.ingress_port_id = md.calc.ingress_port_16;
                    hdr.int_hop.l1_port_ids.egress_port_id = md.calc.egress_port_16;
                }
                if ((bm & 0x2000) != 0) {
                    hdr.int_hop.hop_latency.setValid();
                    hdr.int_hop.hop_latency.hop_latency =
                        (bit<32>)md.egress_ts - (bit<32>)md.ingress_ts;
                }
                if ((bm & 0x1000) != 0) {
                    hdr.int_hop.q_occupancy.setValid();
                    hdr.int_hop.q_occupancy.q_id = md.qid;
                    hdr.int_hop.q_occupancy.q_occupancy = md.q_occupancy;
                }
                if ((bm & 0x0800) != 0) {
                    hdr.int_hop.ingress_tstamp.setValid();
                    hdr.int_hop.ingress_tstamp.ns = md.ingress_ts;
                }
                if ((bm & 0x0400) != 0) {
                    hdr.int_hop.egress_tstamp.setValid();
                    hdr.int_hop.egress_tstamp.ns = md.egress_ts;
                }
                if ((bm & 0x0200) != 0) {
                    // No logical (L2) ports on this switch.
                    hdr.int_hop.l2_port_ids.setValid();
                    hdr.int_hop.l2_port_ids.ingress_port_id = 0xFFFFFFFF;
                    hdr.int_hop.l2_port_ids.egress_port_id = 0xFFFFFFFF;
                }
                if ((bm & 0x0100) != 0) {
                    hdr.int_hop.tx_util.setValid();
                    hdr.int_hop.tx_util.tx_util = md.tx_util;
                }
                // Shared buffer occupancy, reserved bits and the checksum complement: not
                // available here.
                if ((bm & 0x0080) != 0) {
                    hdr.int_hop.buffer.setValid();
                    hdr.int_hop.buffer.value = 0xFFFFFFFF;
                }
                if ((bm & 0x0040) != 0) {
                    hdr.int_hop.rsvd9.setValid();
                    hdr.int_hop.rsvd9.value = 0xFFFFFFFF;
                }
                if ((bm & 0x0020) != 0) {
                    hdr.int_hop.rsvd10.setValid();
                    hdr.int_hop.rsvd10.value = 0xFFFFFFFF;
                }
                if ((bm & 0x0010) != 0) {
                    hdr.int_hop.rsvd11.setValid();
                    hdr.int_hop.rsvd11.value = 0xFFFFFFFF;
                }
                if ((bm & 0x0008) != 0) {
                    hdr.int_hop.rsvd12.setValid();
                    hdr.int_hop.rsvd12.value = 0xFFFFFFFF;
                }
                if ((bm & 0x0004) != 0) {
                    hdr.int_hop.rsvd13.setValid();
                    hdr.int_hop.rsvd13.value = 0xFFFFFFFF;
                }
                if ((bm & 0x0002) != 0) {
                    hdr.int_hop.rsvd14.setValid();
                    hdr.int_hop.rsvd14.value = 0xFFFFFFFF;
                }
                if ((bm & 0x0001) != 0) {
                    hdr.int_hop.checksum.setValid();
                    hdr.int_hop.checksum.value = 0xFFFFFFFF;
                }
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
