/* Test program for the built-in switch: one of each v1model feature the control plane
 * reaches over P4Runtime (LPM with a direct counter, an action selector, ternary+range ACL,
 * indexed counters, a meter, a register, a digest, a parser value set, multicast, clone,
 * packet-in/out on the CPU port) plus IPv4 forwarding that ping and UDP can cross. */
#include <core.p4>
#include <v1model.p4>

const bit<9> CPU_PORT = 255;
const bit<32> CPU_CLONE_SESSION = 100;

@controller_header("packet_in")
header packet_in_t {
    bit<9> ingress_port;
    bit<7> _pad;
}

@controller_header("packet_out")
header packet_out_t {
    bit<9> egress_port;
    bit<7> _pad;
}

header ethernet_t {
    bit<48> dst_addr;
    bit<48> src_addr;
    bit<16> ether_type;
}

header ipv4_t {
    bit<4>  version;
    bit<4>  ihl;
    bit<8>  diffserv;
    bit<16> total_len;
    bit<16> identification;
    bit<3>  flags;
    bit<13> frag_offset;
    bit<8>  ttl;
    bit<8>  protocol;
    bit<16> hdr_checksum;
    bit<32> src_addr;
    bit<32> dst_addr;
}

header l4_ports_t {
    bit<16> src_port;
    bit<16> dst_port;
}

struct headers_t {
    packet_out_t packet_out;
    packet_in_t  packet_in;
    ethernet_t   ethernet;
    ipv4_t       ipv4;
    l4_ports_t   l4;
}

struct mac_learn_t {
    bit<48> src_addr;
    bit<9>  ingress_port;
}

struct metadata_t {
    bit<2>  color;
    bit<32> seen;
}

parser SwitchParser(packet_in pkt, out headers_t hdr, inout metadata_t meta,
                    inout standard_metadata_t std) {
    value_set<bit<16>>(4) ip_ether_types;

    state start {
        transition select(std.ingress_port) {
            CPU_PORT: parse_packet_out;
            default: parse_ethernet;
        }
    }
    state parse_packet_out {
        pkt.extract(hdr.packet_out);
        transition parse_ethernet;
    }
    state parse_ethernet {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            0x0800: parse_ipv4;
            ip_ether_types: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.protocol) {
            6: parse_l4;
            17: parse_l4;
            default: accept;
        }
    }
    state parse_l4 {
        pkt.extract(hdr.l4);
        transition accept;
    }
}

control SwitchVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        verify_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr },
            hdr.ipv4.hdr_checksum, HashAlgorithm.csum16);
    }
}

control SwitchIngress(inout headers_t hdr, inout metadata_t meta,
                      inout standard_metadata_t std) {
    counter(512, CounterType.packets_and_bytes) port_rx;
    direct_counter(CounterType.packets_and_bytes) route_hits;
    meter(512, MeterType.packets) port_meter;
    register<bit<32>>(512) rx_seen;
    action_selector(HashAlgorithm.crc32, 64, 14) ecmp_selector;

    action drop() {
        mark_to_drop(std);
    }
    action set_nexthop(bit<48> dmac, bit<9> port) {
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = dmac;
        std.egress_spec = port;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
    }
    action routed_set_nexthop(bit<48> dmac, bit<9> port) {
        set_nexthop(dmac, port);
    }
    table routes {
        key = { hdr.ipv4.dst_addr : lpm @name("dst_addr"); }
        actions = { routed_set_nexthop; drop; }
        counters = route_hits;
        default_action = drop();
        size = 1024;
    }
    table ecmp {
        key = {
            hdr.ipv4.dst_addr : exact @name("dst_addr");
            hdr.ipv4.src_addr : selector;
            hdr.ipv4.protocol : selector;
            hdr.l4.src_port : selector;
            hdr.l4.dst_port : selector;
        }
        actions = { set_nexthop; drop; }
        implementation = ecmp_selector;
        size = 256;
    }
    action send_to_cpu() {
        std.egress_spec = CPU_PORT;
    }
    action copy_to_cpu() {
        clone(CloneType.I2E, CPU_CLONE_SESSION);
    }
    table acl {
        key = {
            hdr.ipv4.src_addr : ternary @name("src_addr");
            hdr.l4.dst_port : range @name("dst_port");
            hdr.ipv4.protocol : optional @name("protocol");
        }
        actions = { drop; send_to_cpu; copy_to_cpu; NoAction; }
        default_action = NoAction();
        size = 64;
    }
    action learn() {
        digest<mac_learn_t>(1, { hdr.ethernet.src_addr, std.ingress_port });
    }
    table mac_learn {
        key = {
            hdr.ethernet.src_addr : exact @name("src_addr");
        }
        actions = { learn; NoAction; }
        default_action = learn();
        size = 1024;
    }
    action flood(bit<16> group) {
        std.mcast_grp = group;
    }
    table l2_flood {
        key = { hdr.ethernet.dst_addr : exact @name("dst_addr"); }
        actions = { flood; NoAction; }
        default_action = NoAction();
        size = 16;
    }

    apply {
        if (hdr.packet_out.isValid()) {
            std.egress_spec = hdr.packet_out.egress_port;
            hdr.packet_out.setInvalid();
            exit;
        }
        port_rx.count((bit<32>)std.ingress_port);
        rx_seen.read(meta.seen, (bit<32>)std.ingress_port);
        rx_seen.write((bit<32>)std.ingress_port, meta.seen + 1);
        port_meter.execute_meter((bit<32>)std.ingress_port, meta.color);
        if (meta.color == 2) {
            drop();
            exit;
        }
        mac_learn.apply();
        if (l2_flood.apply().hit) {
            exit;
        }
        if (hdr.ipv4.isValid()) {
            if (std.checksum_error == 1 || hdr.ipv4.ttl <= 1) {
                drop();
                exit;
            }
            if (!ecmp.apply().hit) {
                routes.apply();
            }
            acl.apply();
        }
    }
}

control SwitchEgress(inout headers_t hdr, inout metadata_t meta,
                     inout standard_metadata_t std) {
    apply {
        if (std.egress_port == CPU_PORT) {
            hdr.packet_in.setValid();
            hdr.packet_in.ingress_port = std.ingress_port;
            hdr.packet_in._pad = 0;
        }
    }
}

control SwitchComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        update_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr },
            hdr.ipv4.hdr_checksum, HashAlgorithm.csum16);
    }
}

control SwitchDeparser(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.packet_in);
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.l4);
    }
}

V1Switch(SwitchParser(), SwitchVerifyChecksum(), SwitchIngress(), SwitchEgress(),
         SwitchComputeChecksum(), SwitchDeparser()) main;
