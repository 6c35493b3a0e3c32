/* Test program for the traffic manager: port 1 forwards to port 2, and egress writes the
 * packet's queueing metadata into a probe header that follows Ethernet. */
#include <core.p4>
#include <v1model.p4>

header ethernet_t { bit<48> dst_addr; bit<48> src_addr; bit<16> ether_type; }
header probe_t {
    bit<32> enq_qdepth;
    bit<32> deq_qdepth;
    bit<32> enq_timestamp;
    bit<32> deq_timedelta;
    bit<48> ingress_ts;
    bit<48> egress_ts;
}
struct headers_t { ethernet_t ethernet; probe_t probe; }
struct metadata_t { }

parser P(packet_in pkt, out headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    state start { pkt.extract(hdr.ethernet); pkt.extract(hdr.probe); transition accept; }
}
control VC(inout headers_t hdr, inout metadata_t meta) { apply { } }
control I(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    apply { std.egress_spec = 2; }
}
control E(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    apply {
        hdr.probe.enq_qdepth = (bit<32>)std.enq_qdepth;
        hdr.probe.deq_qdepth = (bit<32>)std.deq_qdepth;
        hdr.probe.enq_timestamp = std.enq_timestamp;
        hdr.probe.deq_timedelta = std.deq_timedelta;
        hdr.probe.ingress_ts = std.ingress_global_timestamp;
        hdr.probe.egress_ts = std.egress_global_timestamp;
    }
}
control CC(inout headers_t hdr, inout metadata_t meta) { apply { } }
control D(packet_out pkt, in headers_t hdr) {
    apply { pkt.emit(hdr.ethernet); pkt.emit(hdr.probe); }
}
V1Switch(P(), VC(), I(), E(), CC(), D()) main;
