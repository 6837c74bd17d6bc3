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


def test_a_steady_lag_that_keeps_rising_is_not_bounded():
    flat = [(t / 10, 0.2 + (t % 7) / 100) for t in range(3000)]  # 300 s, jitter only
    rising = [(t / 10, 0.2 + t / 1000) for t in range(3000)]  # +0.1 s of lag every 10 s

    steady = relay.lag_figures(flat, 300.0)
    growing = relay.lag_figures(rising, 300.0)

    assert steady["window_s"] == 60.0 and steady["bounded"] is True
    assert abs(steady["lag_slope_s_per_s"]) < 0.001
    assert growing["bounded"] is False
    assert growing["last_window_p99_s"] > growing["first_window_p99_s"] + 2
    assert growing["lag_slope_s_per_s"] > 0.009
    # A short (--quick) run compares its first and last fifth.
    assert relay.lag_figures(flat[:100], 10.0)["window_s"] == 2.0
    assert relay.lag_figures([], 10.0)["bounded"] is False


def test_steady_seconds_default_to_five_minutes_and_short_when_quick():
    from bench.run import parse_args

    assert parse_args([]).steady_seconds == 300.0
    assert parse_args(["--quick"]).steady_seconds == 10.0
    assert parse_args(["--quick", "--steady-seconds", "30"]).steady_seconds == 30.0


def test_rates_count_one_delivery_per_registered_consumer():
    from idempotency.messaging.relay import consumers_for

    # Loyalty and history here; the e-mails consumer makes it 3 where SHOP_EMAILS is on.
    assert relay.fanout() == len(consumers_for("order.confirmed")) == 2
