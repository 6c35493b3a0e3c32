/*
 * IPv4 routing with ECMP: ipv4_routes (LPM) gives a next id, next_hops picks one of the next
 * id's members with an action selector hashing the 5-tuple, and rewrites the MACs. Packets
 * that cannot be routed are dropped with a reason (drops counter, port_telemetry.p4).
 */
#ifndef XINGMAI_ROUTING_P4
#define XINGMAI_ROUTING_P4

control Routing(inout headers_t hdr, inout local_md_t md) {
    DIRECT_COUNTER(ipv4_routes_counter);
    ECMP_SELECTOR(ecmp_selector, ECMP_SELECTOR_SIZE);

    action drop_with(bit<8> reason) {
        md.drop = 1;
        md.drop_reason = reason;
    }

    action set_next_id(next_id_t next_id) {
        DIRECT_COUNT(ipv4_routes_counter);
        md.next_id = next_id;
    }

    action no_route() {
        DIRECT_COUNT(ipv4_routes_counter);
        drop_with(DROP_NO_ROUTE);
    }

    table ipv4_routes {
        key = {
            hdr.ipv4.dst_addr: lpm @name("ipv4_dst");
        }
        actions = {
            set_next_id;
            @defaultonly no_route;
        }
        const default_action = no_route();
        counters = ipv4_routes_counter;
        size = IPV4_ROUTES_SIZE;
    }

    action route(port_t port, mac_addr_t smac, mac_addr_t dmac) {
        md.egress_spec = port;
        hdr.ethernet.src_addr = smac;
        hdr.ethernet.dst_addr = dmac;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
    }

    table next_hops {
        key = {
            md.next_id: exact @name("next_id");
            hdr.ipv4.src_addr: selector @name("ipv4_src");
            hdr.ipv4.dst_addr: selector @name("ipv4_dst");
            hdr.ipv4.protocol: selector @name("ip_proto");
            md.l4_sport: selector @name("l4_sport");
            md.l4_dport: selector @name("l4_dport");
        }
        actions = {
            route;
        }
        implementation = ECMP_IMPLEMENTATION(ecmp_selector);
        size = NEXT_HOPS_SIZE;
    }

    apply {
        if (!hdr.ipv4.isValid()) {
            drop_with(DROP_NOT_IPV4);
        } else if (md.ipv4_bad_ihl == 1) {
            drop_with(DROP_IPV4_BAD_IHL);
        } else if (md.ipv4_options_unparsed == 1) {
            drop_with(DROP_IPV4_OPTIONS);
        } else if (md.checksum_error) {
            drop_with(DROP_IPV4_BAD_CHECKSUM);
        } else if (hdr.ipv4.ttl <= 1) {
            // Forwarding it would make the TTL 0.
            drop_with(DROP_TTL_EXPIRED);
        } else if (ipv4_routes.apply().hit) {
            // (a table with an action profile cannot have a default action)
            if (!next_hops.apply().hit) {
                drop_with(DROP_NO_NEXT_HOP);
            }
        }
    }
}

#endif
