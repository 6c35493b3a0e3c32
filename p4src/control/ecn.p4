/*
 * ECN marking at egress (the DCQCN baseline's congestion signal). An ECN-capable packet
 * (ECT(0) or ECT(1)) is marked CE when the queue it joined held more than Kmax bytes, and with
 * a probability rising linearly from 0 to Pmax between Kmin and Kmax bytes (RED-like). With
 * Kmin = Kmax the ramp is empty: a plain threshold. Ports without an entry never mark. Only
 * packets the ingress sent (not clones) leaving for a port other than the CPU's are marked.
 * The thresholds, the queue's bytes and the random draw are computed for every packet, and only
 * the marking is conditional: on Tofino 1 (no long branches) a chain of tables inside a
 * condition takes stages of its own, where unconditional tables share stages with the other
 * features' tables.
 */
#ifndef XINGMAI_ECN_P4
#define XINGMAI_ECN_P4

control Ecn(inout headers_t hdr, inout local_md_t md) {
    COUNTER(ecn_marks, PORT_SPACE);
    RandomRamp() ramp;
    QueueBytes() enq_bytes;
    bit<32> kmin = 0;
    bit<32> kmax = 0;
    // q beyond kmax and kmin as saturating differences (nonzero: q > k; a Tofino gateway
    // compares a field with a constant, not two fields)
    bit<32> kmax_over = 0;
    bit<32> kmin_over = 0;
    bit<32> ramp_span = 0;
    @hidden action over_thresholds() {
        kmax_over = md.enq_qdepth_bytes |-| kmax;
        kmin_over = md.enq_qdepth_bytes |-| kmin;
        ramp_span = kmax - kmin;
    }
    bit<16> pmax = 0;
    bit<1> enabled = 0;          // the egress port has thresholds
    bool ramp_hit = false;

    // pmax: marking probability at Kmax, in units of 2^-16 (65535 = 1).
    action set_ecn_thresholds(bit<32> kmin_bytes, bit<32> kmax_bytes, bit<16> pmax_scaled) {
        enabled = 1;
        kmin = kmin_bytes;
        kmax = kmax_bytes;
        pmax = pmax_scaled;
    }

    table ecn_thresholds {
        key = {
            md.egress_port: exact @name("port");
        }
        actions = {
            set_ecn_thresholds;
            @defaultonly NoAction;
        }
        const default_action = NoAction();
        size = ECN_THRESHOLDS_SIZE;
    }

    apply {
        ecn_thresholds.apply();
        enq_bytes.apply(md.enq_qdepth, md.qdepth_unit, md.enq_qdepth_bytes);
        over_thresholds();
        // P(mark) = Pmax * (q - Kmin) / (Kmax - Kmin) for Kmin < q <= Kmax (no hit at q <= Kmin).
        ramp.apply(kmin_over, ramp_span, pmax, ramp_hit);
        if (enabled == 1 && md.pkt_kind == PKT_NORMAL && md.egress_port != CPU_PORT
                && hdr.ipv4.isValid() && (hdr.ipv4.ecn == ECN_ECT0 || hdr.ipv4.ecn == ECN_ECT1)) {
            if (kmax_over != 0 || ramp_hit) {
                hdr.ipv4.ecn = ECN_CE;
                COUNT(ecn_marks, md.egress_port);
            }
        }
    }
}

#endif
