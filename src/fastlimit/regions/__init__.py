"""Several regions, one budget (README, "Regions"), in the parts a
feature folder has: shares (a region's static share of a rule's numbers),
wire (the batches of spends and the rebalancing documents that cross
regions), rebalance (the coordinator's plan for rebalanced static shares),
all without I/O; links (this tier's connection to each peer region),
commands (CL.REGIONSYNC, CL.REGIONDEMAND, CL.REGIONSHARES) and subsystem
(the timers, what arrives, partitions, INFO regions).  The engine's part,
the spends of global rules and their debits, is in _rules.pyx."""
