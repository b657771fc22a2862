"""Several regions, one budget (README, "Regions"): what a region's share
of a rule is (shares: pure arithmetic on a rule's numbers, no event loop),
and this tier's place among the regions (subsystem: the settings and INFO
regions)."""
