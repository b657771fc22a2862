"""envoyproxy/ratelimit compatibility: configuration, matching and the decision."""
