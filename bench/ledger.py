"""Benchmark: gas per ledger call, transactions per second on each chain backend, and what
claiming 256 matured submissions costs.

    .venv/bin/python bench/ledger.py [--txs 200] [--batch 64] [--json]

Gas is read from receipts (the same on every backend: same EVM rules). Transactions/s
is the client's full path (balance check, simulate with eth_call, sign locally, send raw,
await the receipt) for ``submit_work``, sequentially, on: the embedded chain in this
process, the same chain served over JSON-RPC (what ``intellect-node chain`` runs), and
anvil. A worker's rollout batch costs one ``submit_work``, one validator ``accept`` (work
nobody accepted is never paid) and a 256th of a 256-entry ``claim``: gas per rollout is
their sum divided by the batch size. ``submit_work`` is printed next to what it cost before
issue #33 packed the storage; ``--json`` ends with one JSON object (``submit_work_gas``
among its keys). ``claim_256`` accepts 256 submissions, lets them
mature and claims them the way ``intellect-node rewards claim`` does (gas estimated, as
many transactions as it takes) on the embedded chain. The deployed contract's code size is
printed against EIP-170's limit of 24,576 bytes (``code_size`` in the JSON).

Measured on 2026-12-03 (2 cores, 200 transactions): embedded 42.3 tx/s, served 25.7, anvil
61.5 (served 0.42x anvil). Before the served chain turned Nagle's algorithm off on its kept
connections, the same run gave served 3.9 tx/s (0.06x anvil): each answer's body waited for
the client's delayed ACK of its headers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eth_account import Account  # noqa: E402

from crypto.identity import Identity  # noqa: E402
from ledger.chain import Chain, connect, start_anvil  # noqa: E402
from ledger.client import LedgerClient, Params, deploy  # noqa: E402
from ledger.devchain import DevChain, serve  # noqa: E402
from node.cli.devnet import free_port  # noqa: E402

ETH = 10**18
PARAMS = Params(
    min_stake=ETH,
    reward_per_unit=10**12,
    max_units=2**20,
    collateral_bps=20000,
    validator_share_bps=2500,
    verdict_window=3600,
    fetch_deadline=600,
    reward_lock=3600,  # the least the contract allows
    unbonding_delay=86400,
    max_staleness=2,
    quorum=2,
)


# submit_work before issue #33 packed the ledger's storage (same call, same parameters)
SUBMIT_WORK_BEFORE = 224_747
CODE_SIZE_LIMIT = 24_576  # EIP-170: the most runtime code a contract may have


def setup(chain: Chain) -> tuple[LedgerClient, LedgerClient, LedgerClient, LedgerClient]:
    """(owner, validator, second validator, worker) clients on a fresh deployment, with a
    third bonded validator (work needs quorum + 1 validators that can vote on it)."""
    keys = chain.dev_keys
    owner, v1, worker, v2, v3 = (Account.from_key(k) for k in keys[:5])
    address, _ = deploy(chain, owner, PARAMS, [v1.address, v2.address, v3.address])
    o, a, w, b, c = (LedgerClient(chain, address, x) for x in (owner, v1, worker, v2, v3))
    o.fund(100 * ETH)
    for v in (a, b, c):
        v.add_stake(10 * ETH)
    return o, a, b, w


def code_size(chain: Chain) -> int:
    """Bytes of runtime code of a fresh deployment."""
    o, *_ = setup(chain)
    return len(chain.w3.eth.get_code(o.contract.address))


def run_backend(chain: Chain, txs: int) -> tuple[dict[str, int], float]:
    _, v, v2, w = setup(chain)
    worker = w.address
    gas = {"register": w.register_identity(Identity.generate(), 5 * ETH).gasUsed}
    gas["submit_work"] = w.submit_work((1).to_bytes(32, "big"), 64, 0).gasUsed  # its first
    gas["submit_work_next"] = w.submit_work((2).to_bytes(32, "big"), 64, 0).gasUsed
    w.submit_work((3).to_bytes(32, "big"), 64, 0)
    gas["accept"] = v.accept(worker, (1).to_bytes(32, "big")).gasUsed
    gas["reject"] = v.reject(worker, (2).to_bytes(32, "big"), "invalid").gasUsed
    v.accept(worker, (3).to_bytes(32, "big"))
    gas["reject_vote"] = v2.reject(worker, (3).to_bytes(32, "big"), "invalid").gasUsed
    chain.advance_time(PARAMS.verdict_window + PARAMS.reward_lock + 1)
    gas["claim"] = w.claim().gasUsed  # 3 entries: one paid, one slashed, one accepted
    t0 = time.perf_counter()
    for i in range(txs):
        w.submit_work((1000 + i).to_bytes(32, "big"), 64, 0)
    rate = txs / (time.perf_counter() - t0)
    return gas, rate


def claim_256(chain: Chain) -> tuple[int, int]:
    """(total gas, transactions) to claim 256 matured, accepted submissions."""
    _, v, _, w = setup(chain)
    w.register_identity(Identity.generate(), 5 * ETH)
    keys = [(10_000 + i).to_bytes(32, "big") for i in range(256)]
    w.submit_work_many([(k, 64, 0) for k in keys])
    v.send_many([("accept", (w.address, k)) for k in keys])
    chain.advance_time(PARAMS.verdict_window + PARAMS.reward_lock + 1)
    receipts = w.claim_all()
    assert w.matured(w.address) == 0 and w.claimable(w.address) == 0
    return sum(r.gasUsed for r in receipts), len(receipts)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--txs", type=int, default=200, help="submit_work transactions timed per backend"
    )
    ap.add_argument(
        "--batch", type=int, default=64, help="rollouts per work key (for gas per rollout)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    results: dict[str, tuple[dict[str, int], float]] = {}
    results["embedded"] = run_backend(connect("embedded"), args.txs)
    server = serve(DevChain(), free_port())
    try:
        from eth_tester.backends.pyevm.main import get_default_account_keys

        keys = [k.to_hex() for k in get_default_account_keys()]
        results["served"] = run_backend(
            connect(f"http://127.0.0.1:{server.server_address[1]}", dev_keys=keys), args.txs
        )
    finally:
        server.shutdown()
        server.server_close()
    node = start_anvil(free_port())
    try:
        results["anvil"] = run_backend(connect(node.url, dev_keys=node.keys), args.txs)
    finally:
        node.stop()

    gas_256, txs_256 = claim_256(connect("embedded"))
    size = code_size(connect("embedded"))
    gas = results["embedded"][0]

    def same(g: dict[str, int]) -> dict[str, int]:  # register's calldata (a signature over
        return {k: v for k, v in g.items() if k != "register"}  # each chain's key) differs

    if any(same(r[0]) != same(gas) for r in results.values()):
        print(f"note: gas differs between backends: { {k: r[0] for k, r in results.items()} }")
    print(
        f"contract code: {size} bytes of {CODE_SIZE_LIMIT} (EIP-170), "
        f"{CODE_SIZE_LIMIT - size} bytes free"
    )
    print("gas per call (from receipts):")
    for call, g in gas.items():
        print(f"  {call:<16} {g:>8}")
    print(f"  claim of 256 matured entries: {gas_256} gas in {txs_256} transaction(s)")
    print(
        f"  submit_work: {gas['submit_work']} gas (a worker's first; later ones "
        f"{gas['submit_work_next']}), before issue #33's packing {SUBMIT_WORK_BEFORE} "
        f"({gas['submit_work'] / SUBMIT_WORK_BEFORE:.2f} x)"
    )
    per_batch = gas["submit_work"] + gas["accept"] + gas_256 / 256
    per_rollout = per_batch / args.batch
    print(
        f"  gas per rollout: (submit_work + accept + claim_256 / 256) / {args.batch} rollouts "
        f"per work key = {per_rollout:.0f}"
    )
    print(f"transactions/s, submit_work, sequential, full client path ({args.txs} txs):")
    base = results["anvil"][1]
    for name, (_, rate) in results.items():
        print(f"  {name:<9} {rate:8.1f} tx/s   ({rate / base:.2f} x anvil)")
    if args.json:
        print(
            json.dumps(
                {
                    "gas": gas,
                    "submit_work_gas": gas["submit_work"],
                    "submit_work_gas_before": SUBMIT_WORK_BEFORE,
                    "tx_per_s": {k: round(r[1], 1) for k, r in results.items()},
                    "gas_per_rollout": round(per_rollout, 1),
                    "batch": args.batch,
                    "gas_claim_256": gas_256,
                    "claim_256_txs": txs_256,
                    "code_size": size,
                }
            )
        )


if __name__ == "__main__":
    main()
