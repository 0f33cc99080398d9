"""A devnet on a chain that behaves like a real one (issue #55): anvil mining a block every
2 s, two faulty JSON-RPC proxies in front of it (each node has both, a different one first),
and, once the first verdict is on-chain, reorgs of 1 to 3 blocks, dropped pending
transactions, a tenfold base-fee spike and 10 % RPC faults (429, 500, held requests,
resets, stale answers, another chain id) at seeded moments (``bench/chainchaos.py``).
Afterwards the chain's books are exact: no submission left without a verdict, nothing paid
or slashed twice, no honest worker slashed, no account's nonce stuck."""

import pytest

LOSS_KEYS = ("lost", "paid_twice", "slashed_twice", "honest_slashed", "stuck_nonces")


@pytest.mark.slow
def test_the_devnet_keeps_exact_books_on_a_hostile_chain(tmp_path, tiny_model_dir):
    from bench.chainchaos import run

    out = run(
        1,
        steps=2,
        workers=2,
        block_time=2.0,
        timeout=900,
        base=tmp_path,
        model=tiny_model_dir,
        say=lambda *a: None,
    )
    assert out["error"] is None and out["settled"], out
    # every kind of fault was injected and bit
    assert out["reorgs"] >= 1 and out["dropped"] >= 1 and out["fee_spikes"] == 1, out
    assert out["rpc_faults"] >= 10, out
    assert {k: out[k] for k in LOSS_KEYS} == dict.fromkeys(LOSS_KEYS, 0), out.get("lines")
    assert out["steps"] == 2 and out["submitted"] >= 4
