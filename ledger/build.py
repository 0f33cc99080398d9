"""Compile the ledger contract and write (or check) its committed artifact.

    python -m ledger.build           # recompile, write ledger/artifacts/WorkLedger.json
    python -m ledger.build --check   # recompile, fail if the committed artifact differs

The artifact holds the ABI and deployment bytecode, the compiler version, the EVM version
and the source's SHA-256, so a node never needs the compiler at run time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "contracts" / "WorkLedger.vy"
ARTIFACT = HERE / "artifacts" / "WorkLedger.json"
VYPER_VERSION = "0.4.3"
EVM_VERSION = "cancun"


def compile_contract() -> dict[str, object]:
    vyper = Path(sys.executable).parent / "vyper"
    cmd = [
        str(vyper) if vyper.exists() else "vyper",
        "--evm-version",
        EVM_VERSION,
        "-f",
        "abi,bytecode",
        str(SOURCE),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"vyper failed:\n{out.stderr}")
    version = subprocess.run(
        [cmd[0], "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not version.startswith(VYPER_VERSION):
        raise RuntimeError(f"vyper {VYPER_VERSION} required, found {version}")
    abi_line, bytecode = out.stdout.strip().split("\n")
    return {
        "contract": "WorkLedger",
        "compiler": f"vyper {version}",
        "evm_version": EVM_VERSION,
        "source_sha256": hashlib.sha256(SOURCE.read_bytes()).hexdigest(),
        "abi": json.loads(abi_line),
        "bytecode": bytecode.strip(),
    }


def load_artifact() -> dict[str, object]:
    data: dict[str, object] = json.loads(ARTIFACT.read_text())
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="fail if the committed artifact is not what the source compiles to",
    )
    args = ap.parse_args(argv)
    fresh = compile_contract()
    if args.check:
        if not ARTIFACT.exists() or load_artifact() != fresh:
            print(f"{ARTIFACT} is stale: run python -m ledger.build", file=sys.stderr)
            return 1
        print("artifact matches the source")
        return 0
    ARTIFACT.write_text(json.dumps(fresh, indent=1) + "\n")
    print(f"wrote {ARTIFACT} ({len(str(fresh['bytecode'])) // 2 - 1} bytes of bytecode)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
