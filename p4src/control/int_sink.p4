/*
 * INT sink for hosts that do not do INT themselves, and the Telemetry Report v2.0 it sends.
 *
 * Ingress (IntSinkIngress): when a well-formed INT packet is routed to a port listed in
 * int_sink_ports, it is marked for stripping and cloned, as it arrived, to the report clone
 * session with the collector's addresses (report_collector); with no collector configured it
 * is cloned to the CPU clone session instead (packet-in, reason PUNT_REPORT_UNSENT), so the
 * telemetry still reaches the controller.
 * Egress (IntSinkEgress):
 *  - the original: shim, MD header and stack removed, original DSCP restored, IPv4 and UDP
 *    lengths reduced (the IPv4 checksum is recomputed by the architecture).
 *  - the clone: becomes the report: Ethernet/IPv4/UDP to the collector, group header (this
 *    switch's node id, sequence number from a register, +1 per report), individual report
 *    (RepType INT, InType IPv4, F flag, RepMdBits = the packet's instruction bits this sink can
 *    give), the sink's own metadata, then the inner packet from its IPv4 header, as it arrived
 *    (INT stack included), truncated 16 bytes after the stack and to whole words.
 * The sink's hop latency, queue and egress time in a report are those of the latest packet
 * that left the sink port (port_telemetry.p4 registers): the clone cannot carry the stripped
 * packet's own egress measurements (a v1model egress clone would copy the stripped headers).
 */
#ifndef XINGMAI_INT_SINK_P4
#define XINGMAI_INT_SINK_P4

#include "int_common.p4"

control IntSinkIngress(inout headers_t hdr, inout local_md_t md) {
    action set_sink() {
        md.int_sink = 1;
    }

    table int_sink_ports {
        key = {
            md.egress_spec: exact @name("port");
        }
        actions = {
            set_sink;
            @defaultonly NoAction;
        }
        const default_action = NoAction();
        size = INT_SINK_PORTS_SIZE;
    }

    action set_collector(mac_addr_t src_mac, mac_addr_t dst_mac, ipv4_addr_t src_addr,
                         ipv4_addr_t dst_addr, bit<16> dport) {
        md.report = 1;
        md.report_src_mac = src_mac;
        md.report_dst_mac = dst_mac;
        md.report_src_addr = src_addr;
        md.report_dst_addr = dst_addr;
        md.report_dport = dport;
        md.clone = 1;
        md.clone_session = REPORT_CLONE_SESSION;
    }

    action no_collector() {
        md.punt_reason = PUNT_REPORT_UNSENT;
        md.clone = 1;
        md.clone_session = CPU_CLONE_SESSION;
    }

    table report_collector {
        actions = {
            set_collector;
            no_collector;
        }
        default_action = no_collector();
        size = 1;  // no key: the default action is the collector
    }

    apply {
        if (md.drop == 0 && md.punted == 0 && (md.int_status == INT_OK || md.int_source == 1)) {
            if (int_sink_ports.apply().hit) {
                if (md.int_status == INT_OK) {
                    md.report_sink_port = md.egress_spec;
                    report_collector.apply();
                } else {
                    // Source and sink on this switch (both hosts on it, neither doing INT):
                    // no fabric hop to measure, so the packet stays plain.
                    md.int_source = 0;
                    md.int_sink = 0;
                }
            }
        }
    }
}

// What the sink computes, for every packet before the INT branch of egress (on Tofino 1, with
// no long branches, tables inside a branch take stages of their own): the lengths of a strip,
// and a report's metadata bits and lengths.
control IntSinkPrepare(inout headers_t hdr, inout local_md_t md) {
    UnlinkedLow8() report_len_copy;
    UnlinkedCopy16() inner_len_copy;  // the report's lengths apart from the packet's

    // The stripped packet's lengths (the shim's own word too), one step per action.
    // Shim length beyond what the parser can hold (a saturating subtraction: a range comparison
    // with a constant makes bf-p4c cut the field into 4-bit PHV slices).
    @hidden action stack_over() {
        md.calc.stack_over = hdr.int_shim.len |-| (bit<8>)(INT_STACK_MAX_WORDS + 3);
    }
    // INT bytes the packet carries: (1 + shim length) words, once per length field they
    // change.
    @hidden action set_strip_bytes(bit<16> ip_bytes, bit<16> udp_bytes) {
        md.calc.strip_bytes_ip = ip_bytes;
        md.calc.strip_bytes_udp = udp_bytes;
    }
#define STRIP_BYTES(n) set_strip_bytes(((n) + 1) * 4, ((n) + 1) * 4)
    @hidden table strip_lengths {
        key = { hdr.int_shim.len: exact; }
        actions = { set_strip_bytes; }
        const default_action = set_strip_bytes(0, 0);
        const entries = { INT_SHIM_LENGTHS(STRIP_BYTES) }
    }

    // The report's metadata: the packet's instruction bits this sink gives (RepMdBits, all
    // among bits 0-7), with their size and the report lengths that depend on it, from one
    // constant table on the bitmap's high byte (an AND with a mask and a bit count would be a
    // chain of Tofino stages). Report Length counts the words after the individual header's
    // first (2 + metadata + inner packet); the IPv4 and UDP lengths add the bytes of the
    // headers after them.
    bit<16> report_words_extra = 0;
    bit<16> report_ip_extra = 0;
    bit<16> report_udp_extra = 0;
    @hidden action report_md(bit<16> bits, bit<8> words, bit<16> words_extra, bit<16> ip_extra,
                             bit<16> udp_extra) {
        md.calc.rep_bits = bits;
        md.calc.rep_md_words = words;
        report_words_extra = words_extra;
        report_ip_extra = ip_extra;
        report_udp_extra = udp_extra;
    }
#define REPORT_MD_SET(v, w)                                                     \
    report_md((v) & REPORT_MD_SUPPORTED, w, (w) + 2, 4 * (w) + REPORT_IP_HEADERS_BYTES, \
              4 * (w) + REPORT_UDP_HEADERS_BYTES)
    @hidden table report_md_sizes {
        key = { hdr.int_md.instruction_bitmap: ternary; }
        actions = { report_md; }
        const default_action = report_md(0, 0, 2, REPORT_IP_HEADERS_BYTES,
                                         REPORT_UDP_HEADERS_BYTES);
        const entries = { INT_WORDS_BYTE(REPORT_MD_SET, 8, 0, 1, 1, 1, 2, 2, 0, 1) }
    }

    @hidden action report_inner_words() {
        md.calc.inner_words = md.calc.inner_len + 3;
        md.calc.report_ip_len = md.calc.inner_len + report_ip_extra;
        md.calc.report_udp_len = md.calc.inner_len + report_udp_extra;
    }
    @hidden action report_inner_words_down() { md.calc.inner_words = md.calc.inner_words >> 2; }
    @hidden action report_len() {
        md.calc.report_words = md.calc.inner_words + report_words_extra;
    }
    // The 8-bit Report Length, saturated: words |+| 0xFF00 reaches 0xFFFF exactly when the
    // words do not fit, and its low byte is then 0xFF ("to the end of the UDP payload"), the
    // words otherwise (a comparison with a constant or a mask test makes bf-p4c cut the field,
    // and the lengths added to it, into slices that PHV allocation cannot place).
    @hidden action report_len_sat() { md.calc.report_sat = md.calc.report_words |+| 0xFF00; }
    @hidden action report_len_md() {
        md.calc.report_len_md = md.calc.report_len ++ md.calc.rep_md_words;
    }

    apply {
        stack_over();
        strip_lengths.apply();
        report_md_sizes.apply();

        // The inner packet: from IPv4 to 16 bytes past the INT stack, whole words.
        bit<16> int_words = (bit<16>)hdr.int_shim.len + 1;
        bit<16> int_bytes = int_words << 2;
        bit<16> ip_bytes = (bit<16>)hdr.ipv4.ihl << 2;
        bit<16> inner_max = ip_bytes + int_bytes;
        inner_max = inner_max + (8 + REPORT_INNER_PAYLOAD_BYTES);
        inner_len_copy.apply(hdr.ipv4.total_len, md.calc.inner_len);
        if (ARCH_TRUNCATES == 1) {
            if (md.calc.inner_len > inner_max) {
                md.calc.inner_len = inner_max;
            }
            if ((bit<32>)md.calc.inner_len > md.pkt_len - 14) {
                md.calc.inner_len = (bit<16>)(md.pkt_len - 14);
            }
            md.calc.inner_len = md.calc.inner_len & 0xFFFC;
        }
        // (where the target cannot cut the packet it carries all of it, the last word
        // perhaps partly)
        report_inner_words();
        report_inner_words_down();
        report_len();
        report_len_sat();
        report_len_copy.apply(md.calc.report_sat, md.calc.report_len);
        report_len_md();
    }
}

// The strip and the report (after IntSinkPrepare), in the egress branch of the sink's packets
// and of clones.
control IntSinkEgress(inout headers_t hdr, inout local_md_t md) {
    COUNTER(int_sink_events, INT_EVENTS_SIZE);
    REGISTER(bit<32>, report_seq, 1);

    // The sink's metadata per RepMdBits (bits 0 and 6 are never among them), one table per
    // 4 bits (int_common.p4: NIBBLE_TABLE). The sink port's measurements are filled in after
    // port telemetry has read them (PortTelemetryExport).
#define REPORT_L1_PORT_IDS                                                      \
    hdr.report_md.l1_port_ids.setValid();                                       \
    hdr.report_md.l1_port_ids.ingress_port_id = md.calc.ingress_port_16;        \
    hdr.report_md.l1_port_ids.egress_port_id = md.calc.sink_port_16;
#define REPORT_HOP_LATENCY hdr.report_md.hop_latency.setValid();
#define REPORT_Q_OCCUPANCY hdr.report_md.q_occupancy.setValid();
#define REPORT_INGRESS_TSTAMP                                                   \
    hdr.report_md.ingress_tstamp.setValid();                                    \
    hdr.report_md.ingress_tstamp.ns = md.ingress_ts;
#define REPORT_EGRESS_TSTAMP hdr.report_md.egress_tstamp.setValid();
#define REPORT_TX_UTIL hdr.report_md.tx_util.setValid();
    NIBBLE_TABLE(report_md_0_3, md.calc.rep_bits, 12, NO_FILL, REPORT_L1_PORT_IDS,
                 REPORT_HOP_LATENCY, REPORT_Q_OCCUPANCY)
    NIBBLE_TABLE(report_md_4_7, md.calc.rep_bits, 8, REPORT_INGRESS_TSTAMP,
                 REPORT_EGRESS_TSTAMP, NO_FILL, REPORT_TX_UTIL)

    REG_ACTION(report_seq, bit<32>, bit<32>, next_report_seq,
        rv = value;
        value = value + 1;)
    bit<32> seq = 0;

    // The report headers. A Tofino action writes a PHV container from at most two sources
    // (the container itself counting when the action leaves part of it), or one PHV source and
    // constants: the constant fields are written first, then the header fields copied from
    // metadata, one action per container they share.
    @hidden action report_fixed() {
        hdr.report_ethernet.setValid();
        hdr.report_ethernet.ether_type = ETHERTYPE_IPV4;
        hdr.report_ipv4.setValid();
        hdr.report_ipv4.version = 4;
        hdr.report_ipv4.ihl = 5;
        hdr.report_ipv4.dscp = 0;
        hdr.report_ipv4.ecn = 0;
        hdr.report_ipv4.identification = 0;
        hdr.report_ipv4.flags = 0b010;  // DF
        hdr.report_ipv4.frag_offset = 0;
        hdr.report_ipv4.ttl = 64;
        hdr.report_ipv4.protocol = IP_PROTO_UDP;
        hdr.report_ipv4.hdr_checksum = 0;
        hdr.report_udp.setValid();
        hdr.report_udp.sport = REPORT_UDP_SPORT;
        hdr.report_udp.checksum = 0;
        hdr.report_group.setValid();
        hdr.report_group.ver = REPORT_VERSION;
        hdr.report_individual.setValid();
        hdr.report_individual.rep_type = REPORT_TYPE_INT;
        hdr.report_individual.in_type = REPORT_IN_TYPE_IPV4;
        hdr.report_individual.d = 0;
        hdr.report_individual.q = 0;
        hdr.report_individual.f = 1;
        hdr.report_individual.i = 0;
        hdr.report_individual.rsvd = 0;
        hdr.report_individual.ds_md_bits = 0;
        hdr.report_individual.ds_md_status = 0;
    }
    @hidden action report_dst_mac() { hdr.report_ethernet.dst_addr = md.report_dst_mac; }
    @hidden action report_src_mac() { hdr.report_ethernet.src_addr = md.report_src_mac; }
    @hidden action report_addresses() {
        hdr.report_ipv4.src_addr = md.report_src_addr;
        hdr.report_ipv4.dst_addr = md.report_dst_addr;
        hdr.report_udp.dport = md.report_dport;
    }
    @hidden action report_group_hw_id() { hdr.report_group.hw_id = md.hw_id; }
    @hidden action report_group_seq_no() {
        hdr.report_group.seq_no = (bit<22>)seq;
        hdr.report_group.node_id = md.node_id;
    }
    @hidden action report_individual_domain_id() {
        hdr.report_individual.domain_id = hdr.int_md.domain_id;
    }

    @hidden action report_lengths() {
        hdr.report_individual.rep_md_bits = md.calc.rep_bits;
        // (both from one field: with the header's constants they share a container, which an
        // action writes from at most two sources, itself included)
        hdr.report_individual.report_len = md.calc.report_len_md[15:8];
        hdr.report_individual.md_len = md.calc.report_len_md[7:0];
        hdr.report_ipv4.total_len = md.calc.report_ip_len;
        hdr.report_udp.len = md.calc.report_udp_len;
    }

    apply {
        if (md.pkt_kind == PKT_NORMAL) {
            if (md.int_sink == 1 && hdr.int_shim.isValid()) {
                if (md.calc.stack_over != 0) {
                    // More stack than the parser can hold (only where INT_STACK_MAX_WORDS < 252):
                    // it cannot be removed, the packet leaves as it came.
                    COUNT(int_sink_events, INT_SINK_STACK_TOO_LONG);
                } else {
                    hdr.ipv4.dscp = hdr.int_shim.dscp;
                    hdr.ipv4.total_len = hdr.ipv4.total_len - md.calc.strip_bytes_ip;
                    hdr.udp.len = hdr.udp.len - md.calc.strip_bytes_udp;
                    hdr.int_shim.setInvalid();
                    hdr.int_md.setInvalid();
                    hdr.int_stack.setInvalid();
                    md.int_status = INT_NONE;
                    COUNT(int_sink_events, INT_SINK_STRIPPED);
                }
            }
        } else if (md.pkt_kind == PKT_INGRESS_CLONE) {
            if (md.report == 1 && hdr.int_md.isValid()) {
                report_fixed();
                report_md_0_3.apply();
                report_md_4_7.apply();
                report_lengths();
                REG_EXEC(next_report_seq, 0, seq);
                hdr.ethernet.setInvalid();
                report_dst_mac();
                report_src_mac();
                report_addresses();
                report_group_hw_id();
                report_group_seq_no();
                report_individual_domain_id();
                md.truncate_len = (bit<32>)md.calc.report_ip_len + REPORT_ETHERNET_BYTES;
                COUNT(int_sink_events, INT_SINK_REPORT);
            } else if (md.punt_reason == PUNT_REPORT_UNSENT) {
                COUNT(int_sink_events, INT_SINK_REPORT_TO_CPU);
            }
        }
    }
}

#endif
