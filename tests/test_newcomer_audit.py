"""What a newcomer hit (#53, item 6), each fixed with a test here when no other file
covers it."""

from __future__ import annotations

from rich.console import Console

from node.cli.tables import rewards_view

ETH = 10**18


def rendered(r: dict[str, object]) -> str:
    console = Console(record=True, width=200)
    for part in rewards_view(r):
        console.print(part)
    return console.export_text()


def report(**changes: object) -> dict[str, object]:
    r: dict[str, object] = {
        "address": "0x" + "11" * 20,
        "contract": "0x" + "22" * 20,
        "chain_id": 31337,
        "registered": False,
        "registration_valid": False,
        "stake": 0,
        "locked": 0,
        "unbonding": 0,
        "pending": 0,
        "claimable": 0,
        "accepted": 0,
        "rejected": 0,
        "slashed": 0,
        "is_validator": False,
        "history": [],
    }
    return {**r, **changes}


def test_a_validators_rewards_show_its_bond_not_stake_not_registered():
    text = rendered(report(is_validator=True, stake=100 * ETH))
    assert "100" in text.split("stake", 1)[1].splitlines()[0], text
    assert "not registered" not in text
    assert "no peer key registered (a validator needs none)" in text


def test_an_account_with_nothing_staked_is_told_how_to_stake():
    text = rendered(report())
    assert "none (intellect-node stake add AMOUNT registers it)" in text
    registered = rendered(report(registered=True, registration_valid=True, stake=2 * ETH))
    assert "peer key" not in registered and "2" in registered.split("stake", 1)[1]
