"""The relay scenario is discoverable."""

from bench.scenarios import discover, relay


def test_the_relay_scenario_is_discovered():
    scenarios = {s.name: s for s in discover()}
    assert scenarios["relay"].module is relay
    assert scenarios["relay"].description
    assert relay.TARGETS["publish_events_per_s"] == 2000


def test_the_consolidated_scenarios_are_discovered_growth_and_rss_last():
    names = [s.name for s in discover()]
    assert {"peer", "growth", "rss"} <= set(names)
    assert names[-2:] == ["growth", "rss"]
