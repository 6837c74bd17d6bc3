"""The relay scenario is discoverable."""

from bench.scenarios import discover, relay


def test_the_relay_scenario_is_discovered():
    scenarios = {s.name: s for s in discover()}
    assert scenarios["relay"].module is relay
    assert scenarios["relay"].description
    assert relay.TARGETS["publish_events_per_s"] == 2000
