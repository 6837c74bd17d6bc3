"""The chaos run's clients (tools/chaos/workload.py)."""

from __future__ import annotations

from tools.chaos.workload import ACCOUNTS_PER_SHOPPER, _server_took, shopper_accounts


def test_the_servers_own_time_is_read_from_its_server_timing_header():
    assert _server_took("app;dur=20104.3") == 20.104
    assert _server_took("db;dur=3, app;dur=1500") == 1.5
    assert _server_took("") is None  # gunicorn's own error answers have none
    assert _server_took("app;dur=soon") is None


def test_each_shopper_thread_takes_turns_with_its_own_accounts():
    """The load is the threads'; each account places a thread's orders divided by its turns,
    below the limits per shopper (docs/checkout.md, "Limits per shopper")."""
    accounts = [(f"a{index}", f"t{index}") for index in range(12 * ACCOUNTS_PER_SHOPPER)]
    dealt = shopper_accounts(accounts, 12)
    assert len(dealt) == 12 and {len(turns) for turns in dealt} == {ACCOUNTS_PER_SHOPPER}
    assert sorted(account for turns in dealt for account in turns) == sorted(accounts)
    assert shopper_accounts(accounts[:3], 12) == [[accounts[0]], [accounts[1]], [accounts[2]]]
