/*
 * Packet-out and packet-in on the CPU port. A packet-out goes straight to the port the
 * controller named (no lookup); every packet leaving through the CPU port gets a packet-in
 * header with the port it came in on and why it is there (PUNT_*).
 */
#ifndef XINGMAI_PACKET_IO_P4
#define XINGMAI_PACKET_IO_P4

control PacketIoIngress(inout headers_t hdr, inout local_md_t md) {
    apply {
        if (hdr.packet_out.isValid()) {
            md.bypass = 1;
            if (hdr.packet_out.egress_port >= PORT_SPACE) {
                md.drop = 1;
                md.drop_reason = DROP_PACKET_OUT_BAD_PORT;
            } else {
                md.egress_spec = (port_t)hdr.packet_out.egress_port;
            }
            hdr.packet_out.setInvalid();
        }
    }
}

control PacketIoEgress(inout headers_t hdr, inout local_md_t md) {
    apply {
        if (md.egress_port == CPU_PORT) {
            hdr.packet_in.setValid();
            hdr.packet_in.ingress_port = md.calc.ingress_port_16;  // (EgressConfig)
            hdr.packet_in.reason = md.punt_reason;
        }
    }
}

#endif
