/*
 * Architecture shim for v1model (bmv2 simple_switch / simple_switch_grpc and the built-in
 * switch). Feature controls never name a v1model extern or standard_metadata: they use the
 * types and macros below, so that a TNA shim (include/arch/tna.p4) can give the same names
 * Tofino's externs. The top file maps standard_metadata to/from local_md_t.
 */
#ifndef XINGMAI_ARCH_V1MODEL_P4
#define XINGMAI_ARCH_V1MODEL_P4

#include <core.p4>
#include <v1model.p4>

#define ARCH_V1MODEL

typedef bit<9> port_t;

// simple_switch_grpc --cpu-port / xingmai-switch --cpu-port.
#ifndef CPU_PORT
#define CPU_PORT 255
#endif

// Metadata fields carried into ingress-to-egress clones (v1model field list 1).
#define CLONE_FIELD_LIST 1
#define PRESERVE @field_list(CLONE_FIELD_LIST)

// Counters: indexed packets+bytes, and direct (per table entry).
#define COUNTER(name, size) counter((bit<32>)(size), CounterType.packets_and_bytes) name
#define COUNT(name, index) name.count((bit<32>)(index))
#define DIRECT_COUNTER(name) direct_counter(CounterType.packets_and_bytes) name
#define DIRECT_COUNT(name) name.count()

// Registers read and written by index.
#define REGISTER(type, name, size) register<type>((bit<32>)(size)) name
#define REG_READ(name, index, dst) name.read(dst, (bit<32>)(index))
#define REG_WRITE(name, index, value) name.write((bit<32>)(index), value)

// ECMP: an action selector hashing the table's selector keys with CRC-16.
#define ECMP_SELECTOR(name, size) action_selector(HashAlgorithm.crc16, (bit<32>)(size), 32w16) name

// A uniform random value in [lo, hi].
#define RANDOM_RANGE(dst, lo, hi) random(dst, lo, hi)

#endif
