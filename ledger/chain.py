"""Every difference between chain backends, in one module.

Backends: ``embedded`` (py-evm through eth-tester, in this process), an ``http://`` URL
(any JSON-RPC node: our served embedded chain, anvil, a real network), and launchers for
the two local development nodes (``ledger.devchain`` in a thread, anvil as a process).

- Reverts: eth-tester raises its own ``TransactionFailed`` whose text is the reason it has
  already decoded from the revert data; JSON-RPC nodes make web3 raise
  ``ContractLogicError`` carrying the revert data, which we ABI-decode (``Error(string)``).
  Message text of node errors is never parsed.
- Time: eth-tester moves its clock with ``time_travel``; nodes take ``evm_increaseTime``
  and ``evm_mine`` (anvil, and our served chain).
- Receipts: web3 polls every 0.1 s by default, which caps a local node at ~10 tx/s; we
  poll every 10 ms.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eth_abi.abi import decode as abi_decode
from web3 import Web3
from web3.exceptions import ContractLogicError

ERROR_SELECTOR = bytes.fromhex("08c379a0")  # Error(string)
PANIC_SELECTOR = bytes.fromhex("4e487b71")  # Panic(uint256)
RECEIPT_POLL_S = 0.01

# Blocks on top of a transaction's or an event's before a node counts it, per chain id,
# when the run owner sets none: 0 on development chains (they never reorganize); on the
# L2s a run would use, deeper than the reorgs their sequencers have shown; on Ethereum and
# its testnets, the depth wallets and exchanges use. Any other chain: UNKNOWN_CONFIRMATIONS.
CONFIRMATIONS = {
    31337: 0,  # anvil, hardhat
    131277322940537: 0,  # eth-tester (embedded, and the served development chain)
    1: 12,  # Ethereum
    11155111: 6,  # Sepolia
    17000: 6,  # Holesky
    10: 10,  # OP Mainnet
    8453: 10,  # Base
    84532: 10,  # Base Sepolia
    42161: 10,  # Arbitrum One
    421614: 10,  # Arbitrum Sepolia
}
UNKNOWN_CONFIRMATIONS = 6


def default_confirmations(chain_id: int) -> int:
    return CONFIRMATIONS.get(chain_id, UNKNOWN_CONFIRMATIONS)


@dataclass
class Chain:
    w3: Web3
    kind: str  # "embedded" or "rpc"
    url: str
    dev_keys: list[str] = field(default_factory=list)  # prefunded keys of a development chain

    @property
    def chain_id(self) -> int:
        return int(self.w3.eth.chain_id)

    def health(self) -> list[dict[str, Any]]:
        """Per JSON-RPC URL, its answers and faults (``ledger/rpc.py``); none when embedded."""
        from ledger.rpc import FailoverProvider

        provider = self.w3.provider
        return provider.health() if isinstance(provider, FailoverProvider) else []

    def advance_time(self, seconds: int) -> None:
        """Move the chain's clock forward and mine a block (development chains only)."""
        if self.kind == "embedded":
            tester = self.w3.provider.ethereum_tester  # type: ignore[attr-defined]
            now = tester.get_block_by_number("latest")["timestamp"]
            tester.time_travel(now + seconds)
            return
        for method, params in (("evm_increaseTime", [seconds]), ("evm_mine", [])):
            answer = self.w3.provider.make_request(method, params)  # type: ignore[arg-type]
            if "error" in answer:  # web3 hands back an error answer without raising
                raise RuntimeError(f"{method} refused by {self.url}: {answer['error']}")


def connect(
    url: str | list[str] = "embedded",
    *,
    timeout: float = 30,
    dev_keys: list[str] | None = None,
    expected_chain_id: int | None = None,
) -> Chain:
    """``embedded`` (a fresh in-process chain), or one or several http(s):// JSON-RPC URLs
    (a list, or one string with commas), used in turn when one fails (``ledger/rpc.py``)."""
    urls = [u.strip() for u in url.split(",")] if isinstance(url, str) else list(url)
    if urls == ["embedded"]:
        from eth_tester.backends.pyevm.main import get_default_account_keys
        from web3 import EthereumTesterProvider

        keys = [k.to_hex() for k in get_default_account_keys()]
        return Chain(Web3(EthereumTesterProvider()), "embedded", "embedded", keys)
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad or not urls:
        raise ValueError(
            f"unknown chain {bad[0] if bad else url!r}: use 'embedded' or http(s):// JSON-RPC URLs"
        )
    from ledger.rpc import FailoverProvider

    # each URL asked once per try: a refused or reset connection, a 429 or a 5xx goes to the
    # next URL after a backoff; a time-out is not waited out again on the same URL (a node
    # that accepts and never answers would hold each call a minute). Sends are never
    # repeated blindly: broadcast looks a transaction up by its hash first.
    provider = FailoverProvider(urls, timeout=timeout, expected_chain_id=expected_chain_id)
    return Chain(Web3(provider), "rpc", urls[0], list(dev_keys or []))


# ---- local development nodes ------------------------------------------------------------

ANVIL_MNEMONIC = "test test test test test test test test test test test junk"


def mnemonic_keys(mnemonic: str, count: int) -> list[str]:
    from eth_account import Account

    Account.enable_unaudited_hdwallet_features()
    keys = [
        Account.from_mnemonic(mnemonic, account_path=f"m/44'/60'/0'/0/{i}").key.hex()
        for i in range(count)
    ]
    return ["0x" + k.removeprefix("0x") for k in keys]


def anvil_binary() -> Path | None:
    """anvil from the npm package the setup installs (.tools/), else from PATH."""
    local = Path(__file__).resolve().parent.parent / ".tools" / "node_modules" / ".bin" / "anvil"
    if local.exists():
        return local
    found = shutil.which("anvil")
    return Path(found) if found else None


@dataclass
class LocalNode:
    """A development node process this code started; ``stop`` ends it."""

    proc: subprocess.Popen[bytes]
    url: str
    keys: list[str]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def start_anvil(
    port: int,
    *,
    host: str = "127.0.0.1",
    accounts: int = 10,
    timeout: float = 30,
    block_time: float | None = None,
    mining: bool = True,
) -> LocalNode:
    """anvil on ``port``; ``block_time``: a block every that many seconds (interval mining,
    as a real chain), else one block per transaction at once; ``mining`` False: no block
    until one is asked for (``evm_mine``)."""
    binary = anvil_binary()
    if binary is None:
        raise RuntimeError(
            "anvil not found: run scripts/setup.sh (it installs the npm package @foundry-rs/anvil)"
        )
    cmd = [
        str(binary),
        "--host",
        host,
        "--port",
        str(port),
        "--accounts",
        str(accounts),
        "--mnemonic",
        ANVIL_MNEMONIC,
        "--silent",
        *(["--block-time", f"{block_time:g}"] if block_time is not None else []),
        *([] if mining else ["--no-mining"]),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    node = LocalNode(proc, f"http://{host}:{port}", mnemonic_keys(ANVIL_MNEMONIC, accounts))
    _wait_for_rpc(node, timeout)
    return node


def _wait_for_rpc(node: LocalNode, timeout: float) -> None:
    w3 = Web3(Web3.HTTPProvider(node.url, request_kwargs={"timeout": 2}))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node.proc.poll() is not None:
            err = node.proc.stderr.read().decode() if node.proc.stderr else ""
            raise RuntimeError(f"development node exited with {node.proc.returncode}: {err[-500:]}")
        try:
            _ = w3.eth.chain_id
            return
        except Exception:  # not listening yet
            time.sleep(0.1)
    node.stop()
    raise TimeoutError(f"development node at {node.url} did not answer within {timeout} s")


def decode_revert_data(data: Any) -> str | None:
    """The reason in ABI-encoded revert data (Error(string) or Panic(uint256))."""
    if isinstance(data, str):
        try:
            data = bytes.fromhex(data.removeprefix("0x"))
        except ValueError:
            return None
    if not isinstance(data, bytes | bytearray) or len(data) < 4:
        return None
    try:
        if data[:4] == ERROR_SELECTOR:
            return str(abi_decode(["string"], bytes(data[4:]))[0])
        if data[:4] == PANIC_SELECTOR:
            return f"panic 0x{abi_decode(['uint256'], bytes(data[4:]))[0]:02x}"
    except Exception:  # malformed revert data: report it as undecodable
        return None
    return None


def revert_reason(exc: BaseException) -> str | None:
    """The revert reason carried by a call/transaction exception, or None if it is not a revert."""
    if isinstance(exc, ContractLogicError):
        return decode_revert_data(exc.data) or (str(exc.message) if exc.message else "reverted")
    try:
        from eth_tester.exceptions import TransactionFailed
    except ImportError:  # pragma: no cover - eth-tester is a dependency
        return None
    if isinstance(exc, TransactionFailed):
        text = str(exc.args[0]) if exc.args else "reverted"
        return text.removeprefix("execution reverted: ")  # web3's tester provider adds this
    return None
