/*
 * The acl: packets the controller must see (discovery probes, protocol traffic) are punted to
 * the CPU port with a packet-in header; others can be denied. Applied before routing, so a
 * punted packet is never routed.
 */
#ifndef XINGMAI_ACL_P4
#define XINGMAI_ACL_P4

control Acl(inout headers_t hdr, inout local_md_t md) {
    DIRECT_COUNTER(acl_counter);

    action punt_to_cpu() {
        DIRECT_COUNT(acl_counter);
        md.egress_spec = CPU_PORT;
        md.punted = 1;
        md.punt_reason = PUNT_ACL;
    }

    action deny() {
        DIRECT_COUNT(acl_counter);
        md.drop = 1;
        md.drop_reason = DROP_ACL;
    }

    action permit() {
        DIRECT_COUNT(acl_counter);
    }

    table acl {
        key = {
            md.ingress_port: ternary @name("ingress_port");
            hdr.ethernet.ether_type: ternary @name("eth_type");
            hdr.ethernet.dst_addr: ternary @name("eth_dst");
            hdr.ipv4.dst_addr: ternary @name("ipv4_dst");
            hdr.ipv4.protocol: ternary @name("ip_proto");
            md.l4_dport: ternary @name("l4_dport");
        }
        actions = {
            punt_to_cpu;
            deny;
            permit;
        }
        const default_action = permit();
        counters = acl_counter;
        size = ACL_SIZE;
    }

    apply {
        if (hdr.ethernet.isValid()) {
            acl.apply();
        }
    }
}

#endif
