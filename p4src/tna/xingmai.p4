/*
 * xingmai switch dataplane for Tofino: TNA (bf-p4c --target tofino --arch tna) and T2NA
 * (--target tofino2 --arch t2na). The feature controls are p4src/control/*.p4, the same files
 * the v1model program (p4src/xingmai.p4) applies in the same order; this file only does what
 * differs on Tofino:
 *  - intrinsic metadata <-> local_md_t, as the v1model top file does with standard_metadata;
 *  - ingress and egress parse the packet each: what egress needs from ingress travels in a
 *    bridged header, and what a report or CPU clone needs in a mirror header (the v1model
 *    program's PRESERVE fields);
 *  - clones are ingress mirrors (Mirror extern, sessions REPORT_CLONE_SESSION and
 *    CPU_CLONE_SESSION as on v1model), drops are drop_ctl;
 *  - checksums: verified by the parser's checksum unit, recomputed in the egress deparser.
 */
#include "../include/arch/tna.p4"
#include "../include/define.p4"
#include "../include/size.p4"
#include "../include/header.p4"
#include "../parser.p4"
#include "../deparser.p4"
#include "../control/packet_io.p4"
#include "../control/acl.p4"
#include "../control/routing.p4"
#include "../control/config.p4"
#include "../control/port_telemetry.p4"
#include "../control/int_source.p4"
#include "../control/int_transit.p4"
#include "../control/int_sink.p4"
#include "../control/ecn.p4"

// The first byte of what egress receives in front of the packet says what follows.
const bit<8> TNA_BRIDGED = 1;          // bridged_md_t: a packet from ingress
const bit<8> TNA_MIRROR_REPORT = 2;    // report_mirror_t: an ingress mirror for a report
const bit<8> TNA_MIRROR_CPU = 3;       // cpu_mirror_t: an ingress mirror for the CPU
const MirrorType_t TNA_MIRROR_TYPE_REPORT = 1;
const MirrorType_t TNA_MIRROR_TYPE_CPU = 2;

// What egress needs from ingress, for every packet. The fields after the kind byte are
// @flexible: bf-p4c lays them out (order, padding) to suit PHV allocation, the same way in
// the ingress deparser and the egress parser. With a fixed layout, the header's packing ties
// every field it is copied to and from (INT-MD, report and packet-in header fields) into one
// group that PHV allocation cannot place.
@flexible
struct bridged_fields_t {
    port_t ingress_port;
    bit<64> ingress_ts;  // 64 bits as in local_md_t: a widening copy is two sources per container
    bit<8> int_status;
    bit<16> int_source_bitmap;
    bit<8> int_source_hop_budget;
    bit<16> int_source_domain_id;
    bit<16> punt_reason;
    bit<1> int_source;
    bit<1> int_sink;
}

header bridged_md_t {
    bit<8> kind;
    bridged_fields_t f;
}

// What a report or CPU clone needs (v1model: the PRESERVE fields of local_md_t), one header
// each: Tofino 1 mirrors at most 32 bytes of metadata with a packet. A report carries the low
// 32 bits of its ingress time (the rest are the egress time's: TnaEgress); a packet-in has no
// use for it.
@flexible
struct report_mirror_fields_t {
    port_t ingress_port;
    bit<32> ingress_ts_lo;
    port_t report_sink_port;
    mac_addr_t report_src_mac;
    mac_addr_t report_dst_mac;
    ipv4_addr_t report_src_addr;
    ipv4_addr_t report_dst_addr;
    bit<16> report_dport;
}

header report_mirror_t {
    bit<8> kind;
    report_mirror_fields_t f;
}

@flexible
struct cpu_mirror_fields_t {
    port_t ingress_port;
    bit<16> punt_reason;
}

header cpu_mirror_t {
    bit<8> kind;
    cpu_mirror_fields_t f;
}

// Headers no packet has at once, for PHV allocation (bf-p4c may overlay them in the same
// containers): a telemetry report is built by the sink branch of egress on a report clone, an
// INT record is pushed by the transit branch on a normal packet, and a report's inner packet is
// UDP (it carries INT). Left out: the headers bf-p4c fills by aliasing metadata that both
// branches use (ports, timestamps, node id), whose containers must stay apart.
#define NOT_IN_REPORTS(X, r)                                                    \
    X(r, "hdr.tcp") X(r, "hdr.int_hop.hop_latency") X(r, "hdr.int_hop.q_occupancy") \
    X(r, "hdr.int_hop.l2_port_ids") X(r, "hdr.int_hop.tx_util")                   \
    X(r, "hdr.int_hop.buffer") X(r, "hdr.int_hop.rsvd9") X(r, "hdr.int_hop.rsvd10") \
    X(r, "hdr.int_hop.rsvd11") X(r, "hdr.int_hop.rsvd12") X(r, "hdr.int_hop.rsvd13") \
    X(r, "hdr.int_hop.rsvd14") X(r, "hdr.int_hop.checksum")
#define REPORT_HEADERS(X)                                                       \
    NOT_IN_REPORTS(X, "hdr.report_ethernet") NOT_IN_REPORTS(X, "hdr.report_ipv4") \
    NOT_IN_REPORTS(X, "hdr.report_udp") NOT_IN_REPORTS(X, "hdr.report_group")     \
    NOT_IN_REPORTS(X, "hdr.report_individual")                                  \
    NOT_IN_REPORTS(X, "hdr.report_md.hop_latency")                              \
    NOT_IN_REPORTS(X, "hdr.report_md.q_occupancy")                              \
    NOT_IN_REPORTS(X, "hdr.report_md.tx_util")
#define EGRESS_EXCLUSIVE(a, b) @pa_mutually_exclusive("egress", a, b)

REPORT_HEADERS(EGRESS_EXCLUSIVE)
struct tna_md_t {
    local_md_t md;
    bit<8> int_status;  // the INT status ingress decided
    bridged_md_t bridged;
    report_mirror_t report_mirror;
    cpu_mirror_t cpu_mirror;
}

// ---- ingress ---------------------------------------------------------------------------------

parser TnaIngressParser(packet_in pkt, out headers_t hdr, out tna_md_t m,
                        out ingress_intrinsic_metadata_t ig_intr_md) {
    // No INT stack: transit pushes in front of it, the sink removes it in egress.
    XingmaiParser(false) xingmai_parser;

    state start {
        pkt.extract(ig_intr_md);
        pkt.advance(PORT_METADATA_SIZE);
        transition select(ig_intr_md.ingress_port) {
            CPU_PORT: parse_packet_out;
            default: parse_packet;
        }
    }

    state parse_packet_out {
        pkt.extract(hdr.packet_out);
        transition parse_packet;
    }

    state parse_packet {
        xingmai_parser.apply(pkt, hdr, m.md);
        transition accept;
    }
}

control TnaIngress(inout headers_t hdr, inout tna_md_t m,
                   in ingress_intrinsic_metadata_t ig_intr_md,
                   in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                   inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    PacketIoIngress() packet_io;
    Acl() acl;
    Routing() routing;
    IntIngressCheck() int_check;
    IntSourceIngress() int_source;
    IntSinkIngress() int_sink;
    PortTelemetryIngress() port_telemetry;

    apply {
        m.md.ingress_port = ig_intr_md.ingress_port;
        m.md.ingress_ts = (bit<64>)ig_prsr_md.global_tstamp;

        packet_io.apply(hdr, m.md);
        if (m.md.bypass == 0) {
            int_check.apply(hdr, m.md);
            acl.apply(hdr, m.md);
            if (m.md.punted == 0 && m.md.drop == 0) {
                routing.apply(hdr, m.md);
                int_source.apply(hdr, m.md);
                int_sink.apply(hdr, m.md);
            }
        }
        port_telemetry.apply(hdr, m.md);

        if (m.md.drop == 1) {
            ig_dprsr_md.drop_ctl = 1;
        } else {
            ig_tm_md.ucast_egress_port = m.md.egress_spec;
        }
        m.bridged.setValid();
        m.bridged.kind = TNA_BRIDGED;
        m.bridged.f.ingress_port = m.md.ingress_port;
        m.bridged.f.ingress_ts = m.md.ingress_ts;
        m.bridged.f.int_status = m.md.int_status;
        m.bridged.f.int_source = m.md.int_source;
        m.bridged.f.int_source_bitmap = m.md.int_source_bitmap;
        m.bridged.f.int_source_hop_budget = m.md.int_source_hop_budget;
        m.bridged.f.int_source_domain_id = m.md.int_source_domain_id;
        m.bridged.f.int_sink = m.md.int_sink;
        m.bridged.f.punt_reason = m.md.punt_reason;
        if (m.md.clone == 1) {
            if (m.md.clone_session == REPORT_CLONE_SESSION) {
                ig_dprsr_md.mirror_type = TNA_MIRROR_TYPE_REPORT;
                m.report_mirror.kind = TNA_MIRROR_REPORT;
                m.report_mirror.f.ingress_port = m.md.ingress_port;
                m.report_mirror.f.ingress_ts_lo = m.md.ingress_ts[31:0];
                m.report_mirror.f.report_sink_port = m.md.report_sink_port;
                m.report_mirror.f.report_src_mac = m.md.report_src_mac;
                m.report_mirror.f.report_dst_mac = m.md.report_dst_mac;
                m.report_mirror.f.report_src_addr = m.md.report_src_addr;
                m.report_mirror.f.report_dst_addr = m.md.report_dst_addr;
                m.report_mirror.f.report_dport = m.md.report_dport;
            } else {
                ig_dprsr_md.mirror_type = TNA_MIRROR_TYPE_CPU;
                m.cpu_mirror.kind = TNA_MIRROR_CPU;
                m.cpu_mirror.f.ingress_port = m.md.ingress_port;
                m.cpu_mirror.f.punt_reason = m.md.punt_reason;
            }
        }
    }
}

control TnaIngressDeparser(packet_out pkt, inout headers_t hdr, in tna_md_t m,
                           in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    Mirror() mirror;
    XingmaiDeparser() xingmai_deparser;

    apply {
        if (ig_dprsr_md.mirror_type == TNA_MIRROR_TYPE_REPORT) {
            mirror.emit<report_mirror_t>((MirrorId_t)m.md.clone_session, m.report_mirror);
        } else if (ig_dprsr_md.mirror_type == TNA_MIRROR_TYPE_CPU) {
            mirror.emit<cpu_mirror_t>((MirrorId_t)m.md.clone_session, m.cpu_mirror);
        }
        pkt.emit(m.bridged);
        xingmai_deparser.apply(pkt, hdr);
    }
}

// ---- egress ----------------------------------------------------------------------------------

parser TnaEgressParser(packet_in pkt, out headers_t hdr, out tna_md_t m,
                       out egress_intrinsic_metadata_t eg_intr_md) {
    XingmaiParser(false) xingmai_parser;
    XingmaiParser(true) sink_parser;  // the sink removes the stack: extract it
    XingmaiParser(false) clone_parser;

    // The bridged and mirrored values are set into local_md_t here, by the parser, not by an
    // egress action: a copy action would tie each metadata field to the bridged header's
    // layout in PHV allocation, and through the header fields the controls copy it to, every
    // header of the program into one group that cannot be placed.
    state start {
        pkt.extract(eg_intr_md);
        // (set by the parser: copies in the control would be a chain of dependent stages)
        m.md.egress_port = eg_intr_md.egress_port;
        m.md.enq_qdepth = (bit<32>)eg_intr_md.enq_qdepth;
        m.md.deq_qdepth = (bit<32>)eg_intr_md.deq_qdepth;
        m.md.pkt_len = (bit<32>)eg_intr_md.pkt_length;
        transition select(pkt.lookahead<bit<8>>()) {
            TNA_BRIDGED: parse_bridged;
            TNA_MIRROR_REPORT: parse_report_mirror;
            TNA_MIRROR_CPU: parse_cpu_mirror;
            default: reject;
        }
    }

    state parse_bridged {
        pkt.extract(m.bridged);
        m.md.pkt_kind = PKT_NORMAL;
        m.md.ingress_port = m.bridged.f.ingress_port;
        m.md.ingress_ts = m.bridged.f.ingress_ts;
        m.md.int_source = m.bridged.f.int_source;
        m.md.int_source_bitmap = m.bridged.f.int_source_bitmap;
        m.md.int_source_hop_budget = m.bridged.f.int_source_hop_budget;
        m.md.int_source_domain_id = m.bridged.f.int_source_domain_id;
        m.md.int_sink = m.bridged.f.int_sink;
        m.md.punt_reason = m.bridged.f.punt_reason;
        m.int_status = m.bridged.f.int_status;  // replaces the packet parser's, in egress
        transition select(m.bridged.f.int_sink) {
            1: parse_sink_packet;
            default: parse_packet;
        }
    }

    state parse_report_mirror {
        pkt.extract(m.report_mirror);  // a report carries the stack as it came
        m.md.pkt_kind = PKT_INGRESS_CLONE;
        m.md.report = 1;
        m.md.ingress_port = m.report_mirror.f.ingress_port;
        m.md.ingress_ts = (bit<64>)m.report_mirror.f.ingress_ts_lo;
        m.md.report_sink_port = m.report_mirror.f.report_sink_port;
        m.md.report_src_mac = m.report_mirror.f.report_src_mac;
        m.md.report_dst_mac = m.report_mirror.f.report_dst_mac;
        m.md.report_src_addr = m.report_mirror.f.report_src_addr;
        m.md.report_dst_addr = m.report_mirror.f.report_dst_addr;
        m.md.report_dport = m.report_mirror.f.report_dport;
        transition parse_clone_packet;
    }

    state parse_cpu_mirror {
        pkt.extract(m.cpu_mirror);
        m.md.pkt_kind = PKT_INGRESS_CLONE;
        m.md.ingress_port = m.cpu_mirror.f.ingress_port;
        m.md.punt_reason = m.cpu_mirror.f.punt_reason;
        transition parse_clone_packet;
    }

    state parse_sink_packet {
        sink_parser.apply(pkt, hdr, m.md);
        transition accept;
    }

    state parse_packet {
        xingmai_parser.apply(pkt, hdr, m.md);
        transition accept;
    }

    state parse_clone_packet {
        clone_parser.apply(pkt, hdr, m.md);
        transition accept;
    }
}

control TnaEgress(inout headers_t hdr, inout tna_md_t m,
                  in egress_intrinsic_metadata_t eg_intr_md,
                  in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                  inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                  inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {
    EgressConfig() config;
    PacketIoEgress() packet_io;
    PortTelemetryEgress() port_telemetry;
    PortTelemetryExport() port_telemetry_export;
    IntSinkPrepare() int_sink_prepare;
    IntSourcePrepare() int_source_prepare;
    IntTransitPrepare() int_transit_prepare;
    IntSinkEgress() int_sink;
    IntSourceEgress() int_source;
    IntTransitEgress() int_transit;
    Ecn() ecn;
    UnlinkedCopy32() egress_ts_lo;
    UnlinkedCopy32() egress_ts_hi;
    UnlinkedCopy32() egress_ts_10;

    apply {
        if (m.md.pkt_kind == PKT_NORMAL) {
            m.md.int_status = m.int_status;
        }
        // Widened by the hash unit: copied by an action, the 48-bit intrinsic timestamp (16-bit
        // containers) would put egress_ts, and the 32-bit hop latency and tx window computed from
        // it, in one container-size group.
        egress_ts_lo.apply(eg_prsr_md.global_tstamp[31:0], m.md.egress_ts[31:0]);
        egress_ts_hi.apply((bit<32>)eg_prsr_md.global_tstamp[47:32], m.md.egress_ts[63:32]);
        egress_ts_10.apply(eg_prsr_md.global_tstamp[41:10], m.md.egress_ts_10);
        if (m.md.report == 1) {
            // A report's ingress time: the mirror carries its low 32 bits, the egress time the
            // rest (off by 2^32 ns only when the clone's queueing crossed such a boundary).
            m.md.ingress_ts[47:32] = eg_prsr_md.global_tstamp[47:32];
        }
        // (the queue id is not set by the parser: bf-p4c then extracts INT's q_id from it)
        m.md.qid = (bit<8>)eg_intr_md.egress_qid;
        config.apply(hdr, m.md);
        ecn.apply(hdr, m.md);
        port_telemetry.apply(hdr, m.md);
        // The sink (strip or report), and source + transit, in exclusive branches: a Tofino
        // pipeline places exclusive tables in the same stages. They need nothing of port
        // telemetry but the values PortTelemetryExport fills in after them.
        // Where their computations run: on Tofino 1 (no long branches) before the branches, so
        // that only the header writes take the branches' stages; on Tofino 2 (long branches: a
        // branch costs no stages) inside them, where PHV allocation can overlay the sink's and
        // the transit's metadata, which it needs to fit.
#if __TARGET_TOFINO__ == 2
        if (m.md.pkt_kind == PKT_INGRESS_CLONE || m.md.int_sink == 1) {
            int_sink_prepare.apply(hdr, m.md);
            int_sink.apply(hdr, m.md);
        } else if (m.md.pkt_kind == PKT_NORMAL && m.md.egress_port != CPU_PORT) {
            int_source_prepare.apply(hdr, m.md);
            int_transit_prepare.apply(hdr, m.md);
            int_source.apply(hdr, m.md);
            int_transit.apply(hdr, m.md);
        }
#else
        int_sink_prepare.apply(hdr, m.md);
        int_source_prepare.apply(hdr, m.md);
        int_transit_prepare.apply(hdr, m.md);
        if (m.md.pkt_kind == PKT_INGRESS_CLONE || m.md.int_sink == 1) {
            int_sink.apply(hdr, m.md);
        } else if (m.md.pkt_kind == PKT_NORMAL && m.md.egress_port != CPU_PORT) {
            int_source.apply(hdr, m.md);
            int_transit.apply(hdr, m.md);
        }
#endif
        port_telemetry_export.apply(hdr, m.md);
        if (m.md.egress_port == CPU_PORT) {
            packet_io.apply(hdr, m.md);
        }

        if (m.md.drop == 1) {
            eg_dprsr_md.drop_ctl = 1;
        }
    }
}

control TnaEgressDeparser(packet_out pkt, inout headers_t hdr, in tna_md_t m,
                          in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    Checksum() ipv4_checksum;
    Checksum() report_ipv4_checksum;
    XingmaiDeparser() xingmai_deparser;

    apply {
        if (hdr.ipv4.isValid()) {
            hdr.ipv4.hdr_checksum = ipv4_checksum.update(
                { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp, hdr.ipv4.ecn,
                  hdr.ipv4.total_len, hdr.ipv4.identification, hdr.ipv4.flags,
                  hdr.ipv4.frag_offset, hdr.ipv4.ttl, hdr.ipv4.protocol, hdr.ipv4.src_addr,
                  hdr.ipv4.dst_addr });  // no options: IPV4_OPTIONS_PARSED is 0
        }
        if (hdr.report_ipv4.isValid()) {
            hdr.report_ipv4.hdr_checksum = report_ipv4_checksum.update(
                { hdr.report_ipv4.version, hdr.report_ipv4.ihl, hdr.report_ipv4.dscp,
                  hdr.report_ipv4.ecn, hdr.report_ipv4.total_len,
                  hdr.report_ipv4.identification, hdr.report_ipv4.flags,
                  hdr.report_ipv4.frag_offset, hdr.report_ipv4.ttl, hdr.report_ipv4.protocol,
                  hdr.report_ipv4.src_addr, hdr.report_ipv4.dst_addr });
        }
        xingmai_deparser.apply(pkt, hdr);
    }
}

Pipeline(TnaIngressParser(), TnaIngress(), TnaIngressDeparser(),
         TnaEgressParser(), TnaEgress(), TnaEgressDeparser()) pipe;

Switch(pipe) main;
