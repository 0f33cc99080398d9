"""Benchmark: gas per ledger call and transactions per second on each chain backend.

    .venv/bin/python bench/ledger.py [--txs 200] [--batch 64] [--json]

Gas is read from receipts (the same on every backend: same EVM rules). Transactions/s
is the client's full path (simulate with eth_call, sign locally, send raw, await the
receipt) for ``submit_work``, sequentially, on: the embedded chain in this process, the
same chain served over JSON-RPC (what ``intellect-node chain`` runs), and anvil. A worker
submits one work key per rollout batch, so gas per rollout = submit_work gas / batch size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eth_account import Account  # noqa: E402

from ledger.chain import Chain, connect, start_anvil  # noqa: E402
from ledger.client import LedgerClient, Params, deploy  # noqa: E402
from ledger.devchain import DevChain, serve  # noqa: E402
from node.devnet import free_port  # noqa: E402

ETH = 10**18
PARAMS = Params(ETH, 10**15, 2000, 5000, 3600, 86400, 60)


def run_backend(chain: Chain, txs: int) -> tuple[dict[str, int], float]:
    keys = chain.dev_keys
    owner, validator, worker = (Account.from_key(k) for k in keys[:3])
    address, _ = deploy(chain, owner, PARAMS)
    o, v, w = (LedgerClient(chain, address, a) for a in (owner, validator, worker))
    o.set_validator(validator.address, True)
    o.fund(10 * ETH)
    gas = {"register": w.register(bytes(range(32)), 5 * ETH).gasUsed}
    gas["submit_work"] = w.submit_work((1).to_bytes(32, "big"), 64, 1).gasUsed
    w.submit_work((2).to_bytes(32, "big"), 64, 1)
    gas["accept"] = v.accept((1).to_bytes(32, "big")).gasUsed
    gas["reject"] = v.reject((2).to_bytes(32, "big")).gasUsed
    chain.advance_time(PARAMS.reward_lock + 1)
    gas["claim"] = w.claim().gasUsed
    t0 = time.perf_counter()
    for i in range(txs):
        w.submit_work((1000 + i).to_bytes(32, "big"), 64, 1)
    rate = txs / (time.perf_counter() - t0)
    return gas, rate


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

    gas = results["embedded"][0]
    if any(r[0] != gas for r in results.values()):
        print(f"note: gas differs between backends: { {k: r[0] for k, r in results.items()} }")
    print("gas per call (from receipts):")
    for call, g in gas.items():
        print(f"  {call:<12} {g:>8}")
    per_rollout = gas["submit_work"] / args.batch
    print(
        f"  gas per rollout: submit_work / {args.batch} rollouts per work key = {per_rollout:.0f}"
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
                    "tx_per_s": {k: round(r[1], 1) for k, r in results.items()},
                    "gas_per_rollout": round(per_rollout, 1),
                    "batch": args.batch,
                }
            )
        )


if __name__ == "__main__":
    main()
