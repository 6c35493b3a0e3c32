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
// 8-byte units, every other bit a 4-byte unit. A lookup per 4-bit slice, each adding its words
// to the sum: the form a Tofino stage can compute (no bit counting in its ALUs); the tables
// are constant and hidden from the control plane.
// The sum is 16 bits wide (at most 19 words): the width of the length fields it is added to, so
// that Tofino's ALUs add it without zero-extension.
control IntHopWords(in bit<16> bitmap, out bit<16> words) {
    bit<16> sum = 0;

    @hidden action add_words(bit<16> w) { sum = sum + w; }

    @hidden table instruction_words_0_3 {
        key = { bitmap[15:12]: exact; }
        actions = { add_words; }
        const default_action = add_words(0);
        const entries = { INT_NIBBLE_WORDS(add_words, 1, 1, 1, 1) }
    }

    @hidden table instruction_words_4_7 {
        key = { bitmap[11:8]: exact; }
        actions = { add_words; }
        const default_action = add_words(0);
        const entries = { INT_NIBBLE_WORDS(add_words, 2, 2, 2, 1) }
    }

    @hidden table instruction_words_8_11 {
        key = { bitmap[7:4]: exact; }
        actions = { add_words; }
        const default_action = add_words(0);
        const entries = { INT_NIBBLE_WORDS(add_words, 1, 1, 1, 1) }
    }

    @hidden table instruction_words_12_15 {
        key = { bitmap[3:0]: exact; }
        actions = { add_words; }
        const default_action = add_words(0);
        const entries = { INT_NIBBLE_WORDS(add_words, 1, 1, 1, 1) }
    }

    apply {
        instruction_words_0_3.apply();
        instruction_words_4_7.apply();
        instruction_words_8_11.apply();
        instruction_words_12_15.apply();
        words = sum;
    }
}

#endif
