/*
 * The smallest program where bmv2 and the P4 language pick different parser transitions: a
 * case whose keyset matches everything (`0 &&& 0`) before value cases and a default. P4 takes
 * the first matching case; p4c-bm2-ss writes that case as a "default" transition, and bmv2
 * tries the value cases first and then goes to the state's last default. The built-in switch
 * does what bmv2 does (parser_default_case.stf): EtherType 0x0800 leaves on port 2, any other
 * on port 3, and nothing on port 1. p4src's sink ran into this (issue 22).
 */
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dst_addr;
    bit<48> src_addr;
    bit<16> ether_type;
}

struct headers_t {
    ethernet_t ethernet;
}

struct meta_t {
    bit<9> port;
}

parser ParserImpl(packet_in pkt, out headers_t hdr, inout meta_t meta,
                  inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            0 &&& 0: match_all;
            0x0800: ipv4;
            default: other;
        }
    }

    state match_all {
        meta.port = 1;
        transition accept;
    }

    state ipv4 {
        meta.port = 2;
        transition accept;
    }

    state other {
        meta.port = 3;
        transition accept;
    }
}

control NoVerify(inout headers_t hdr, inout meta_t meta) {
    apply { }
}

control IngressImpl(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    apply {
        sm.egress_spec = meta.port;
    }
}

control EgressImpl(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    apply { }
}

control NoCompute(inout headers_t hdr, inout meta_t meta) {
    apply { }
}

control DeparserImpl(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.ethernet);
    }
}

V1Switch(ParserImpl(), NoVerify(), IngressImpl(), EgressImpl(), NoCompute(), DeparserImpl())
    main;
