/*
 * ECN marking at egress (the DCQCN baseline's congestion signal). An ECN-capable packet
 * (ECT(0) or ECT(1)) is marked CE when the queue it joined held more than Kmax bytes, and with
 * a probability rising linearly from 0 to Pmax between Kmin and Kmax bytes (RED-like). With
 * Kmin = Kmax the ramp is empty: a plain threshold. Ports without an entry never mark.
 */
#ifndef XINGMAI_ECN_P4
#define XINGMAI_ECN_P4

control Ecn(inout headers_t hdr, inout local_md_t md) {
    COUNTER(ecn_marks, PORT_SPACE);
    RandomRamp() ramp;
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

    // pmax: marking probability at Kmax, in units of 2^-16 (65535 = 1).
    action set_ecn_thresholds(bit<32> kmin_bytes, bit<32> kmax_bytes, bit<16> pmax_scaled) {
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
        if (hdr.ipv4.isValid() && (hdr.ipv4.ecn == ECN_ECT0 || hdr.ipv4.ecn == ECN_ECT1)) {
            if (ecn_thresholds.apply().hit) {
                bool mark = false;
                over_thresholds();
                if (kmax_over != 0) {
                    mark = true;
                } else if (kmin_over != 0) {
                    // P(mark) = Pmax * (q - Kmin) / (Kmax - Kmin).
                    ramp.apply(kmin_over, ramp_span, pmax, mark);
                }
                if (mark) {
                    hdr.ipv4.ecn = ECN_CE;
                    COUNT(ecn_marks, md.egress_port);
                }
            }
        }
    }
}

#endif
