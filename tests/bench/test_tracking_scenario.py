"""The tracking scenario is discoverable and seeds what it says (1,000 events, 10 % twice)."""

import pytest

from bench.scenarios import discover, tracking
from orders import tracking as tracking_reads


def test_the_tracking_scenario_is_discovered():
    scenarios = {s.name: s for s in discover()}
    assert scenarios["tracking"].module is tracking
    assert scenarios["tracking"].description


@pytest.mark.django_db
def test_seed_makes_a_duplicated_and_a_deduplicated_shipment(shopper):
    ids = tracking.seed(owner=shopper, events=200)
    duplicated = tracking_reads.tracking_summary(shipment_id=ids["duplicated"])
    clean = tracking_reads.tracking_summary(shipment_id=ids["deduplicated"])
    assert (duplicated.received, duplicated.distinct, duplicated.suspicious) == (220, 200, 0)
    assert (clean.received, clean.distinct) == (200, 200)
    events = list(tracking_reads.tracking_events(shipment_id=ids["duplicated"]))
    assert len(events) == 200
    assert [e.occurred_at for e in events] == sorted(e.occurred_at for e in events)
