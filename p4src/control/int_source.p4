/*
 * INT source for hosts that do not do INT themselves. At ingress the watchlist (5-tuple,
 * ternary) picks the flows to monitor and the instruction bitmap, hop budget and domain id;
 * at egress the shim and MD header are inserted (original DSCP saved in the shim, the INT DSCP
 * set, lengths updated, UDP checksum 0), and transit then adds this hop's metadata.
 * Only UDP packets that are not INT already are sources; hosts whose NIC is the INT source
 * send INT packets, which the watchlist never touches.
 */
#ifndef XINGMAI_INT_SOURCE_P4
#define XINGMAI_INT_SOURCE_P4

#include "int_common.p4"

control IntSourceIngress(inout headers_t hdr, inout local_md_t md) {
    DIRECT_COUNTER(int_watchlist_counter);

    action mark_to_source(bit<16> instruction_bitmap, bit<8> hop_budget, bit<16> domain_id) {
        DIRECT_COUNT(int_watchlist_counter);
        md.int_source = 1;
        md.int_source_bitmap = instruction_bitmap;
        md.int_source_hop_budget = hop_budget;
        md.int_source_domain_id = domain_id;
    }

    action no_source() {
        DIRECT_COUNT(int_watchlist_counter);
    }

    table int_watchlist {
        key = {
            hdr.ipv4.src_addr: ternary @name("ipv4_src");
            hdr.ipv4.dst_addr: ternary @name("ipv4_dst");
            hdr.ipv4.protocol: ternary @name("ip_proto");
            md.l4_sport: ternary @name("l4_sport");
            md.l4_dport: ternary @name("l4_dport");
        }
        actions = {
            mark_to_source;
            @defaultonly no_source;
        }
        const default_action = no_source();
        counters = int_watchlist_counter;
        size = INT_WATCHLIST_SIZE;
    }

    apply {
        if (hdr.udp.isValid() && md.int_status == INT_NONE && md.drop == 0 && md.punted == 0) {
            int_watchlist.apply();
        }
    }
}

// What the source needs to decide, for every packet, before the INT branch of egress (on
// Tofino 1, with no long branches, tables inside a branch take stages of their own): this
// record's size for the watchlist's bitmap, and the IPv4 length with the INT headers against
// the MTU. IntTransitPrepare uses them for the packets the source will insert into.
control IntSourcePrepare(inout headers_t hdr, inout local_md_t md) {
    IntHopWords() hop_words;

    @hidden action src_mtu_over() { md.calc.src_mtu_over = md.calc.src_len_after |-| md.mtu; }
    @hidden action src_length_after() {
        md.calc.src_len_after = hdr.ipv4.total_len |+| INT_HEADERS_BYTES;  // saturates
    }

    apply {
        hop_words.apply(md.int_source_bitmap, md.calc.md_words);
        src_length_after();
        src_mtu_over();
    }
}

// The insertion (after IntSourcePrepare), in the egress branch of normal packets.
control IntSourceEgress(inout headers_t hdr, inout local_md_t md) {
    COUNTER(int_source_events, INT_EVENTS_SIZE);

    // The shim and MD header: constants first, then each field copied from metadata in an
    // action of its own (a Tofino action writes a container from one PHV source and constants,
    // or two PHV sources, the container itself counting when part of it is left).
    @hidden action shim_fixed() {
        hdr.int_shim.setValid();
        hdr.int_shim.int_type = INT_TYPE_MD;
        hdr.int_shim.npt = 0;
        hdr.int_shim.rsvd = 0;
        hdr.int_shim.len = INT_MD_WORDS;
        hdr.int_shim.rsvd2 = 0;
        hdr.int_shim.rsvd3 = 0;
    }
    @hidden action shim_dscp() { hdr.int_shim.dscp = hdr.ipv4.dscp; }
    @hidden action md_fixed() {
        hdr.int_md.setValid();
        hdr.int_md.ver = INT_VERSION;
        hdr.int_md.d = 0;
        hdr.int_md.e = 0;
        hdr.int_md.m = 0;
        hdr.int_md.rsvd = 0;
        hdr.int_md.ds_instruction = 0;
        hdr.int_md.ds_flags = 0;
    }
    // Hop ML from a constant table on the record size: narrowing the 16-bit size to the 5-bit
    // field in an action would tie its PHV slicing to every length it is added to.
    @hidden action md_hop_ml(bit<5> words) { hdr.int_md.hop_ml = words; }
#define MD_HOP_ML(n) md_hop_ml(n)
    @hidden table md_hop_mls {
        key = { md.calc.md_words: exact; }
        actions = { md_hop_ml; }
        const default_action = md_hop_ml(0);
        const entries = {
            INT_HOP_ML_VALUES(MD_HOP_ML)
        }
    }
    @hidden action md_hop_cnt() { hdr.int_md.remaining_hop_cnt = md.int_source_hop_budget; }
    @hidden action md_bitmap() { hdr.int_md.instruction_bitmap = md.int_source_bitmap; }
    @hidden action md_domain_id() { hdr.int_md.domain_id = md.int_source_domain_id; }

    apply {
        if (md.int_source == 1 && md.int_sink == 0 && hdr.udp.isValid()
                && !hdr.int_shim.isValid()) {
            if (md.calc.src_mtu_over != 0) {
                COUNT(int_source_events, INT_SOURCE_MTU);
            } else {
                shim_fixed();
                shim_dscp();
                md_fixed();
                md_hop_mls.apply();
                md_hop_cnt();
                md_bitmap();
                md_domain_id();
                hdr.ipv4.dscp = INT_DSCP;
                hdr.ipv4.total_len = hdr.ipv4.total_len + INT_HEADERS_BYTES;
                hdr.udp.len = hdr.udp.len + INT_HEADERS_BYTES;
                hdr.udp.checksum = 0;
                md.int_status = INT_OK;
                COUNT(int_source_events, INT_SOURCE_INSERTED);
            }
        }
    }
}

#endif
