/*
 * Every table, selector, counter and register size, in one place. Sized for a 51.2T-class
 * switch: up to 128 front-panel ports plus the CPU port; per-port arrays cover the whole 9-bit
 * port space so that no port number can index past them.
 */
#ifndef XINGMAI_SIZE_P4
#define XINGMAI_SIZE_P4

#define PORT_SPACE 512             // 9-bit port numbers
#define PORT_TABLE_SIZE 256        // per-port config entries (128 front panel + CPU + spare)

#define IPV4_ROUTES_SIZE 16384
#define NEXT_HOPS_SIZE 4096        // next ids (one entry per ECMP group or single next hop)
#define ECMP_SELECTOR_SIZE 4096    // action profile members
#define ECMP_MAX_GROUP_SIZE 64     // Tofino's selector: members per group (ECMP width)
#define ECMP_GROUPS 1024           // Tofino's selector: groups
#define ACL_SIZE 512
#define INT_WATCHLIST_SIZE 1024
#define INT_SINK_PORTS_SIZE PORT_TABLE_SIZE
#define ECN_THRESHOLDS_SIZE PORT_TABLE_SIZE

#endif
