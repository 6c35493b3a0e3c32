/*
 * xingmai switch dataplane for v1model (bmv2 simple_switch_grpc, the built-in switch).
 *
 * This file only wires the shared blocks: it maps standard_metadata into local_md_t, applies
 * the feature controls in order, and carries out their requests (forward, drop, clone,
 * truncate) with v1model's externs. Checksums are here because v1model computes them in
 * pipeline stages of their own. p4src/README.md describes the control-plane API.
 */
#include "include/arch/v1model.p4"
#include "include/define.p4"
#include "include/size.p4"
#include "include/header.p4"
#include "parser.p4"
#include "deparser.p4"
#include "control/packet_io.p4"
#include "control/acl.p4"
#include "control/routing.p4"
#include "control/config.p4"
#include "control/port_telemetry.p4"
#include "control/int_source.p4"
#include "control/int_transit.p4"
#include "control/int_sink.p4"
#include "control/ecn.p4"

parser V1ModelParser(packet_in pkt, out headers_t hdr, inout local_md_t md,
                     inout standard_metadata_t sm) {
    // The sink strips the stack in egress, which does not parse again, so the stack is
    // extracted here, after XingmaiParser, and not by XingmaiParser(true): with v1model's
    // INT_STACK_MAX_WORDS every shim length fits, p4c-bm2-ss writes the sub-parser's
    // `0 &&& 0` case as a "default" transition, and bmv2 falls back to the state's last
    // default (int_ok), which left the stack in the payload.
    XingmaiParser(false) xingmai_parser;

    state start {
        md.ingress_port = sm.ingress_port;
        transition select(sm.ingress_port) {
            CPU_PORT: parse_packet_out;
            default: parse_packet;
        }
    }

    state parse_packet_out {
        pkt.extract(hdr.packet_out);
        transition parse_packet;
    }

    state parse_packet {
        xingmai_parser.apply(pkt, hdr, md);
        transition select(md.int_status) {
            INT_OK: parse_int_stack_start;
            default: accept;
        }
    }

    // A packet whose INT headers passed is INT_OK only once its stack is in: a truncated stack
    // is judged truncated at ingress, as truncated headers before it are.
    state parse_int_stack_start {
        md.int_status = INT_NONE;
        transition parse_int_stack;
    }

    INT_STACK_PARSER_STATES(int_stack_ok)

    state int_stack_ok {
        md.int_status = INT_OK;
        transition accept;
    }
}

control V1ModelVerifyChecksum(inout headers_t hdr, inout local_md_t md) {
    apply {
        verify_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp, hdr.ipv4.ecn, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr,
              hdr.ipv4_options.options },
            hdr.ipv4.hdr_checksum, HashAlgorithm.csum16);
    }
}

control XingmaiIngress(inout headers_t hdr, inout local_md_t md,
                       inout standard_metadata_t sm) {
    PacketIoIngress() packet_io;
    Acl() acl;
    Routing() routing;
    IntIngressCheck() int_check;
    IntSourceIngress() int_source;
    IntSinkIngress() int_sink;
    PortTelemetryIngress() port_telemetry;

    apply {
        md.ingress_ts = (bit<64>)sm.ingress_global_timestamp * 1000;
        md.checksum_error = sm.checksum_error == 1;

        packet_io.apply(hdr, md);
        if (md.bypass == 0) {
            int_check.apply(hdr, md);
            acl.apply(hdr, md);
            if (md.punted == 0 && md.drop == 0) {
                routing.apply(hdr, md);
                int_source.apply(hdr, md);
                int_sink.apply(hdr, md);
            }
        }
        port_telemetry.apply(hdr, md);

        if (md.drop == 1) {
            mark_to_drop(sm);
        } else {
            sm.egress_spec = md.egress_spec;
        }
        if (md.clone == 1) {
            clone_preserving_field_list(CloneType.I2E, md.clone_session, CLONE_FIELD_LIST);
        }
    }
}

control XingmaiEgress(inout headers_t hdr, inout local_md_t md,
                      inout standard_metadata_t sm) {
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

    apply {
        md.egress_port = sm.egress_port;
        md.egress_ts = (bit<64>)sm.egress_global_timestamp * 1000;
        md.egress_ts_10 = md.egress_ts[41:10];
        md.enq_qdepth = (bit<32>)sm.enq_qdepth;
        md.deq_qdepth = (bit<32>)sm.deq_qdepth;
        md.qid = (bit<8>)sm.priority;  // simple_switch: the priority queue the packet used
        md.pkt_len = sm.packet_length;
        if (sm.instance_type == 0) {
            md.pkt_kind = PKT_NORMAL;
        } else if (sm.instance_type == 1) {
            md.pkt_kind = PKT_INGRESS_CLONE;
        } else {
            md.pkt_kind = PKT_OTHER;
        }

        config.apply(hdr, md);
        ecn.apply(hdr, md);
        port_telemetry.apply(hdr, md);
        int_sink_prepare.apply(hdr, md);
        int_source_prepare.apply(hdr, md);
        int_transit_prepare.apply(hdr, md);
        // The sink (strip or report), and source + transit, in exclusive branches: a Tofino
        // pipeline places exclusive tables in the same stages. They need nothing of port
        // telemetry but the values PortTelemetryExport fills in after them.
        if (md.pkt_kind == PKT_INGRESS_CLONE || md.int_sink == 1) {
            int_sink.apply(hdr, md);
        } else if (md.pkt_kind == PKT_NORMAL && md.egress_port != CPU_PORT) {
            int_source.apply(hdr, md);
            int_transit.apply(hdr, md);
        }
        port_telemetry_export.apply(hdr, md);
        if (md.egress_port == CPU_PORT) {
            packet_io.apply(hdr, md);
        }

        if (md.drop == 1) {
            mark_to_drop(sm);
        }
        if (md.truncate_len != 0) {
            truncate(md.truncate_len);
        }
    }
}

control V1ModelComputeChecksum(inout headers_t hdr, inout local_md_t md) {
    apply {
        update_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp, hdr.ipv4.ecn, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr,
              hdr.ipv4_options.options },
            hdr.ipv4.hdr_checksum, HashAlgorithm.csum16);
        update_checksum(hdr.report_ipv4.isValid(),
            { hdr.report_ipv4.version, hdr.report_ipv4.ihl, hdr.report_ipv4.dscp,
              hdr.report_ipv4.ecn, hdr.report_ipv4.total_len, hdr.report_ipv4.identification,
              hdr.report_ipv4.flags, hdr.report_ipv4.frag_offset, hdr.report_ipv4.ttl,
              hdr.report_ipv4.protocol, hdr.report_ipv4.src_addr, hdr.report_ipv4.dst_addr },
            hdr.report_ipv4.hdr_checksum, HashAlgorithm.csum16);
    }
}

V1Switch(V1ModelParser(), V1ModelVerifyChecksum(), XingmaiIngress(), XingmaiEgress(),
         V1ModelComputeChecksum(), XingmaiDeparser()) main;
