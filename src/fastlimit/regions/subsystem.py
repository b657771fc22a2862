"""This tier's place among the regions in the server: INFO regions (the
region, the fleet's regions, and with INFO regions named, each static
rule's share here).  The shares themselves are applied where rules are
defined (rules/registry.py, through shares.share_spec)."""

from __future__ import annotations

from collections.abc import Mapping

from fastlimit.server.subsystem import Subsystem


class RegionsSubsystem(Subsystem):
    def __init__(self, server):
        self.regions = server.regions
        self.rules = server.rules

    def info_sections(self, sections: frozenset[str],
                      named: frozenset[str]) -> Mapping[str, Mapping[str, object]]:
        if "regions" not in sections:
            return {}
        static = [rule for rule in self.rules.list() if rule.regions == "static"]
        r = self.regions
        out: dict[str, object] = {
            "region": r.name if r else "", "regions": ",".join(r.names) if r else "",
            "region_count": len(r.names) if r else 0, "static_rules": len(static)}
        if "regions" in named and r is not None:
            for i, rule in enumerate(sorted(static, key=lambda rule: rule.id)):
                weight, total = r.weights(rule.shares)    # the registry took it here
                out[f"static{i}"] = f"id={rule.id},share={weight}/{total}"
        return {"regions": out}

