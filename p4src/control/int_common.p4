/*
 * What INT source, transit and the ingress check agree on: the size of one hop's record.
 */
#ifndef XINGMAI_INT_COMMON_P4
#define XINGMAI_INT_COMMON_P4

// The 16 entries of a table that maps a 4-bit slice of the instruction bitmap to the words its
// instructions take; w3..w0 are the words of the slice's bits, most significant first.
#define INT_NIBBLE_WORDS(set, w3, w2, w1, w0) \
    0: set(0);                      1: set(w0); \
    2: set(w1);                     3: set(w1 + w0); \
    4: set(w2);                     5: set(w2 + w0); \
    6: set(w2 + w1);                7: set(w2 + w1 + w0); \
    8: set(w3);                     9: set(w3 + w0); \
    10: set(w3 + w1);               11: set(w3 + w1 + w0); \
    12: set(w3 + w2);               13: set(w3 + w2 + w0); \
    14: set(w3 + w2 + w1);          15: set(w3 + w2 + w1 + w0);

// Words one hop's metadata takes for an instruction bitmap (bit 0 = MSB): bits 4, 5 and 6 are
// 8-byte units, every other bit a 4-byte unit. A lookup per 4-bit slice and two additions, the
// form a Tofino stage can compute (no bit counting in its ALUs); the tables are constant and
// hidden from the control plane.
control IntHopWords(in bit<16> bitmap, out bit<5> words) {
    bit<5> w0 = 0;
    bit<5> w1 = 0;
    bit<5> w2 = 0;
    bit<5> w3 = 0;

    @hidden action set_w0(bit<5> w) { w0 = w; }
    @hidden action set_w1(bit<5> w) { w1 = w; }
    @hidden action set_w2(bit<5> w) { w2 = w; }
    @hidden action set_w3(bit<5> w) { w3 = w; }

    @hidden table instruction_words_0_3 {
        key = { bitmap[15:12]: exact; }
        actions = { set_w0; }
        const default_action = set_w0(0);
        const entries = { INT_NIBBLE_WORDS(set_w0, 1, 1, 1, 1) }
    }

    @hidden table instruction_words_4_7 {
        key = { bitmap[11:8]: exact; }
        actions = { set_w1; }
        const default_action = set_w1(0);
        const entries = { INT_NIBBLE_WORDS(set_w1, 2, 2, 2, 1) }
    }

    @hidden table instruction_words_8_11 {
        key = { bitmap[7:4]: exact; }
        actions = { set_w2; }
        const default_action = set_w2(0);
        const entries = { INT_NIBBLE_WORDS(set_w2, 1, 1, 1, 1) }
    }

    @hidden table instruction_words_12_15 {
        key = { bitmap[3:0]: exact; }
        actions = { set_w3; }
        const default_action = set_w3(0);
        const entries = { INT_NIBBLE_WORDS(set_w3, 1, 1, 1, 1) }
    }

    apply {
        instruction_words_0_3.apply();
        instruction_words_4_7.apply();
        instruction_words_8_11.apply();
        instruction_words_12_15.apply();
        words = (w0 + w1) + (w2 + w3);
    }
}

#endif
