/*
 * Header emission order, shared by the architectures. A report is the report encapsulation
 * followed by the inner packet from its IPv4 header (the original Ethernet header is
 * invalidated); a transit hop's record goes between the MD header and the stack it arrived with.
 */
#ifndef XINGMAI_DEPARSER_P4
#define XINGMAI_DEPARSER_P4

control XingmaiDeparser(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.packet_in);
        pkt.emit(hdr.report_ethernet);
        pkt.emit(hdr.report_ipv4);
        pkt.emit(hdr.report_udp);
        pkt.emit(hdr.report_group);
        pkt.emit(hdr.report_individual);
        pkt.emit(hdr.report_md.l1_port_ids);
        pkt.emit(hdr.report_md.hop_latency);
        pkt.emit(hdr.report_md.q_occupancy);
        pkt.emit(hdr.report_md.ingress_tstamp);
        pkt.emit(hdr.report_md.egress_tstamp);
        pkt.emit(hdr.report_md.tx_util);
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv4);
#if IPV4_OPTIONS_PARSED
        pkt.emit(hdr.ipv4_options);
#endif
        pkt.emit(hdr.udp);
        pkt.emit(hdr.tcp);
        pkt.emit(hdr.int_shim);
        pkt.emit(hdr.int_md);
        pkt.emit(hdr.int_hop.node_id);
        pkt.emit(hdr.int_hop.l1_port_ids);
        pkt.emit(hdr.int_hop.hop_latency);
        pkt.emit(hdr.int_hop.q_occupancy);
        pkt.emit(hdr.int_hop.ingress_tstamp);
        pkt.emit(hdr.int_hop.egress_tstamp);
        pkt.emit(hdr.int_hop.l2_port_ids);
        pkt.emit(hdr.int_hop.tx_util);
        pkt.emit(hdr.int_hop.buffer);
        pkt.emit(hdr.int_hop.rsvd9);
        pkt.emit(hdr.int_hop.rsvd10);
        pkt.emit(hdr.int_hop.rsvd11);
        pkt.emit(hdr.int_hop.rsvd12);
        pkt.emit(hdr.int_hop.rsvd13);
        pkt.emit(hdr.int_hop.rsvd14);
        pkt.emit(hdr.int_hop.checksum);
        pkt.emit(hdr.int_stack);
    }
}

#endif
