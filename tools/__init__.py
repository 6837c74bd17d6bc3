"""Dev tooling (never imported by production code)."""
