/* Test program for v1model primitives the conformance corpus exercises little: hash() with
 * several algorithms, random(), truncate(), log_msg(), header stack push/pop, a parser
 * lookahead and verify(). tests/p4/primitives.stf holds the packets. */
#include <core.p4>
#include <v1model.p4>

header ethernet_t { bit<48> dst_addr; bit<48> src_addr; bit<16> ether_type; }
header data_t { bit<32> a; bit<32> b; }
header results_t {
    bit<16> crc16; bit<32> crc32; bit<16> csum16; bit<16> xor16; bit<16> identity;
    bit<8>  rnd; bit<8> lookahead; bit<8> depth;
}
header tag_t { bit<8> v; }

struct headers_t {
    ethernet_t ethernet;
    data_t     data;
    results_t  results;
    tag_t[4]   tags;
}
struct metadata_t { bit<8> peek; }

error { BadMagic }

parser P(packet_in pkt, out headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    state start {
        pkt.extract(hdr.ethernet);
        verify(hdr.ethernet.ether_type != 0xdead, error.BadMagic);
        meta.peek = pkt.lookahead<bit<8>>();
        pkt.extract(hdr.data);
        pkt.extract(hdr.results);
        transition parse_tags;
    }
    state parse_tags {
        pkt.extract(hdr.tags.next);
        transition select(hdr.tags.last.v) {
            0: accept;
            default: parse_tags;
        }
    }
}

control VC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control I(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    apply {
        if (std.parser_error == error.BadMagic) {
            std.egress_spec = 3;
            exit;
        }
        std.egress_spec = 2;
        hash(hdr.results.crc16, HashAlgorithm.crc16, 16w0, { hdr.data.a, hdr.data.b }, 32w65536);
        hash(hdr.results.crc32, HashAlgorithm.crc32, 32w0, { hdr.data.a, hdr.data.b }, 64w4294967296);
        hash(hdr.results.csum16, HashAlgorithm.csum16, 16w0, { hdr.data.a, hdr.data.b }, 32w65536);
        hash(hdr.results.xor16, HashAlgorithm.xor16, 16w0, { hdr.data.a, hdr.data.b }, 32w65536);
        hash(hdr.results.identity, HashAlgorithm.identity, 16w100, { hdr.data.b }, 32w1000);
        random(hdr.results.rnd, 8w10, 8w20);
        hdr.results.lookahead = meta.peek;
        hdr.tags.push_front(1);
        hdr.tags[0].setValid();
        hdr.tags[0].v = 0xee;
        hdr.results.depth = (bit<8>)std.packet_length;
        log_msg("a={} b={}", { hdr.data.a, hdr.data.b });
        if (hdr.data.a == 0xffffffff) {
            truncate(20);
        }
    }
}

control E(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    apply {
        if (hdr.data.b == 0x0badf00d) {
            hdr.tags.pop_front(2);
        }
    }
}

control CC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control D(packet_out pkt, in headers_t hdr) {
    apply { pkt.emit(hdr.ethernet); pkt.emit(hdr.data); pkt.emit(hdr.results); pkt.emit(hdr.tags); }
}

V1Switch(P(), VC(), I(), E(), CC(), D()) main;
