/*
 * The parser, shared by the architectures: the top file's parser extracts what the
 * architecture puts in front of the packet (intrinsic metadata, bridged metadata, the
 * packet-out header of a packet from the CPU port) and then applies XingmaiParser, built with
 * with_int_stack true where the INT stack must be extracted (v1model: everywhere; TNA: in
 * egress, for the packets a sink strips).
 *
 * Ethernet, IPv4 (options skipped into ipv4_options), UDP/TCP ports, and INT-MD v2.1 over UDP
 * when the DSCP is INT_DSCP: the shim, the MD header and, when with_int_stack, the metadata
 * stack (one opaque field; otherwise it stays payload, which is all INT transit needs).
 * Where the architecture verifies checksums in the parser (TNA), the IPv4 header checksum is
 * verified here into md.checksum_error (IPV4_CHECKSUM_* from the shim); v1model verifies it in
 * its checksum control.
 * The parser only judges what it can see in the headers; md.int_status stays INT_NONE when an
 * extract fails part-way (the ingress check then calls the packet truncated), so a malformed
 * INT packet is never dropped here: it keeps its bytes and is forwarded without INT processing.
 */
#ifndef XINGMAI_PARSER_P4
#define XINGMAI_PARSER_P4

// A stack fits the parser when its shim length (stack + MD header words) is at most
// INT_STACK_MAX_WORDS + 3, which the shim makes 2^k - 1 so that a mask on the length tells.
#if ((INT_STACK_MAX_WORDS + 4) & (INT_STACK_MAX_WORDS + 3)) != 0
#error "INT_STACK_MAX_WORDS + 4 must be a power of two"
#endif
#define INT_SHIM_LEN_FITS_MASK (8w0xFF ^ (INT_STACK_MAX_WORDS + 3))

parser XingmaiParser(packet_in pkt, inout headers_t hdr, inout local_md_t md)
                     (bool with_int_stack) {
    IPV4_CHECKSUM_DECL

    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        IPV4_CHECKSUM_ADD(hdr.ipv4)
        transition select(hdr.ipv4.version, hdr.ipv4.ihl) {
            (4, 5): parse_l4;
            (4, 0 &&& 0xC): ipv4_malformed;   // IHL 0..3
            (4, 4): ipv4_malformed;
            (4, _): parse_ipv4_options;
            default: ipv4_malformed;
        }
    }

    state ipv4_malformed {
        md.ipv4_bad_ihl = 1;
        transition accept;
    }

    state parse_ipv4_options {
#if IPV4_OPTIONS_PARSED
        pkt.extract(hdr.ipv4_options, ((bit<32>)hdr.ipv4.ihl - 5) << 5);
        IPV4_CHECKSUM_ADD(hdr.ipv4_options)
        transition parse_l4;
#else
        // Not parsed where the parse depth is kept for the INT stack (TNA): the packet is
        // dropped at ingress (DROP_IPV4_OPTIONS), its checksum could not be recomputed.
        md.ipv4_options_unparsed = 1;
        transition accept;
#endif
    }

    state parse_l4 {
        IPV4_CHECKSUM_VERIFY(md.checksum_error)
        // Only the first fragment carries the L4 header.
        transition select(hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (0, IP_PROTO_UDP): parse_udp;
            (0, IP_PROTO_TCP): parse_tcp;
            default: accept;
        }
    }

    state parse_tcp {
        pkt.extract(hdr.tcp);
        md.l4_sport = hdr.tcp.sport;
        md.l4_dport = hdr.tcp.dport;
        transition accept;
    }

    state parse_udp {
        pkt.extract(hdr.udp);
        md.l4_sport = hdr.udp.sport;
        md.l4_dport = hdr.udp.dport;
        transition select(hdr.ipv4.dscp) {
            INT_DSCP: parse_int_shim;
            default: accept;
        }
    }

    state parse_int_shim {
        pkt.extract(hdr.int_shim);
        transition select(hdr.int_shim.int_type, hdr.int_shim.npt) {
            (INT_TYPE_MD, 0): parse_int_md;
            default: int_unsupported;
        }
    }

    state int_unsupported {
        md.int_status = INT_UNSUPPORTED;
        transition accept;
    }

    state parse_int_md {
        pkt.extract(hdr.int_md);
        transition select(hdr.int_md.ver, hdr.int_md.hop_ml, hdr.int_shim.len) {
            (INT_VERSION, 0, _): int_bad_hop_ml;
            (INT_VERSION, _, 0 &&& 0xFE): int_bad_shim_len;  // 0, 1
            (INT_VERSION, _, 2): int_bad_shim_len;
            (INT_VERSION, _, _): int_headers_ok;
            default: int_bad_version;
        }
    }

    state int_bad_hop_ml {
        md.int_status = INT_BAD_HOP_ML;
        transition accept;
    }

    state int_bad_shim_len {
        md.int_status = INT_BAD_SHIM_LEN;
        transition accept;
    }

    state int_bad_version {
        md.int_status = INT_BAD_VERSION;
        transition accept;
    }

    state int_headers_ok {
        // (a constant: the compiler keeps one of the two transitions)
        transition select(with_int_stack) {
            true: int_stack_fits;
            false: int_ok;
        }
    }

    state int_stack_fits {
        transition select(hdr.int_shim.len) {
            0 &&& INT_SHIM_LEN_FITS_MASK: parse_int_stack;
            default: int_ok;
        }
    }

    // The stack (shim length - 3 words), from the shim: extracted into hdr.int_stack, or
    // skipped where the architecture removes it that way (the bytes a parser skips are not
    // emitted).
    INT_STACK_PARSER_STATES(int_ok)

    state int_ok {
        md.int_status = INT_OK;
        transition accept;
    }
}

#endif
