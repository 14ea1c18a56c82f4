"""Silent faults (issue 34): a stuck peer, latency, resets and cut commits through a fault proxy,
real packet drops in a network namespace of a test's own, and a failover."""
