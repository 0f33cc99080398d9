"""The WorkLedger on each chain backend the ledger tests use, with a run already set up.

``ledger`` is parametrized over the in-process py-evm chain, the same chain served over
JSON-RPC (what ``intellect-node chain`` runs) and anvil (a real dev node), so every test
that takes it runs on all three. Import it into a test module with
``from tests.helpers.ledger import ledger_fixture  # noqa: F401``.
"""

from __future__ import annotations

import pytest
from eth_account import Account
from eth_tester.backends.pyevm.main import get_default_account_keys

from crypto.identity import Identity
from ledger.chain import connect, start_anvil
from ledger.client import LedgerClient, Params, deploy
from ledger.devchain import DevChain, serve
from node.cli.devnet import free_port

ETH = 10**18
PARAMS = Params(
    min_stake=1 * ETH,
    reward_per_unit=10**15,
    max_units=10_000,
    collateral_bps=20_000,  # collateral = 2 x reward
    validator_share_bps=2_500,  # a quarter of a slash to the validator, the rest burned
    verdict_window=3600,
    fetch_deadline=600,
    reward_lock=3600,
    unbonding_delay=86400,
    max_staleness=2,
    quorum=2,
)
VALIDATOR_BOND = 25 * ETH  # a validator votes only with stake >= the largest collateral, 20 ETH
BURN = "0x0000000000000000000000000000000000000000"


def key(i: int) -> bytes:
    return i.to_bytes(32, "big")


class Ledger:
    """Owner (key 0), validators v1, v2, v3 (keys 1, 4, 5, bonded), worker (key 2) and a
    stranger (key 3), neither registered yet; 100 ETH in the pool."""

    def __init__(self, chain, params: Params = PARAMS, *, extra_validators: int = 0) -> None:
        self.chain = chain
        self.params = params
        keys = chain.dev_keys
        self.owner = Account.from_key(keys[0])
        self.v1, self.v2, self.v3 = (Account.from_key(keys[i]) for i in (1, 4, 5))
        # more validators (keys 6, 7, ...), for tests that need more than quorum + 1
        self.extra = [Account.from_key(keys[6 + i]) for i in range(extra_validators)]
        self.validators = [self.v1, self.v2, self.v3, *self.extra]
        self.worker = Account.from_key(keys[2])
        self.stranger = Account.from_key(keys[3])
        self.address, self.block = deploy(
            chain, self.owner, params, [v.address for v in self.validators]
        )
        self.as_owner = self.client(self.owner)
        self.as_owner.fund(100 * ETH)
        for v in self.validators:
            self.client(v).add_stake(VALIDATOR_BOND)
        self.identities: dict[str, Identity] = {}

    def client(self, account, **kw) -> LedgerClient:
        return LedgerClient(self.chain, self.address, account, **kw)

    def register(self, account, stake: int) -> LedgerClient:
        c = self.client(account)
        ident = Identity.generate()
        self.identities[account.address] = ident
        c.register_identity(ident, stake)
        return c

    def balance(self, account) -> int:
        address = account if isinstance(account, str) else account.address
        return self.chain.w3.eth.get_balance(address)

    def now(self) -> int:
        return int(self.chain.w3.eth.get_block("latest")["timestamp"])

    def mature(self) -> None:
        """Past every submission's verdict window and challenge period."""
        self.chain.advance_time(self.params.verdict_window + self.params.reward_lock + 1)


def paid(receipt) -> int:
    """Gas paid by a receipt's sender."""
    return receipt.gasUsed * receipt.effectiveGasPrice


@pytest.fixture(name="ledger", params=["embedded", "served", "anvil"])
def ledger_fixture(request):
    if request.param == "embedded":
        yield Ledger(connect("embedded"))
    elif request.param == "served":
        server = serve(DevChain(), free_port())
        keys = [k.to_hex() for k in get_default_account_keys()]
        try:
            yield Ledger(connect(f"http://127.0.0.1:{server.server_address[1]}", dev_keys=keys))
        finally:
            server.shutdown()
            server.server_close()
    else:
        node = start_anvil(free_port())
        try:
            yield Ledger(connect(node.url, dev_keys=node.keys))
        finally:
            node.stop()
