"""The node's EVM account: a standard encrypted keystore file (eth-account, scrypt).

``<data_dir>/account.json``, mode 0600; ``--force`` keeps the old one as
``account.json.bak-<time>``. The password comes from, in order: a file named by
``--password-file``, the environment variable ``INTELLECT_NODE_PASSWORD``, or a prompt.
"""

from __future__ import annotations

import getpass
import json
import os
import time
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils.address import to_checksum_address

ACCOUNT_FILE = "account.json"
PASSWORD_ENV = "INTELLECT_NODE_PASSWORD"
# scrypt's work factor for a keystore whose password is public (the devnet's): geth's
# --lightkdf N; 15 ms to decrypt here against 0.9 s at eth-account's default (2**18)
LIGHT_SCRYPT_N = 4096


class AccountError(RuntimeError):
    """No keystore, a wrong password, or no way to ask for one."""


def account_path(data_dir: Path) -> Path:
    return data_dir / ACCOUNT_FILE


def read_password(password_file: Path | None = None, *, confirm: bool = False) -> str:
    if password_file is not None:
        try:
            return password_file.read_text().rstrip("\n")
        except OSError as exc:
            raise AccountError(f"cannot read password file {password_file}: {exc}") from exc
    if PASSWORD_ENV in os.environ:
        return os.environ[PASSWORD_ENV]
    try:
        password = getpass.getpass("keystore password: ")
        if confirm and getpass.getpass("repeat password: ") != password:
            raise AccountError("passwords do not match")
    except EOFError as exc:
        raise AccountError(f"no password: pass --password-file or set {PASSWORD_ENV}") from exc
    return password


def create_account(
    data_dir: Path,
    password: str,
    *,
    force: bool = False,
    private_key: str | None = None,
    scrypt_n: int | None = None,
) -> LocalAccount:
    """A new keystore (``scrypt_n``: the KDF's work factor, eth-account's 2**18 unless given)."""
    path = account_path(data_dir)
    if path.exists() and not force:
        raise AccountError(f"{path} already exists (use --force to replace it)")
    if not password:
        raise AccountError("refusing an empty keystore password")
    if path.exists():
        backup_keystore(path)
    account: LocalAccount = Account.from_key(private_key) if private_key else Account.create()
    keystore = Account.encrypt(account.key, password, kdf="scrypt", iterations=scrypt_n)
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(keystore, f)
    os.replace(tmp, path)
    return account


def backup_keystore(path: Path) -> Path:
    """Move a keystore aside (``account.json.bak-<time>``, mode 0600) before it is replaced:
    it may hold stake, rewards or unbonding funds."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    backup = path.with_name(f"{path.name}.bak-{stamp}")
    n = 1
    while backup.exists():
        backup = path.with_name(f"{path.name}.bak-{stamp}-{n}")
        n += 1
    os.link(path, backup)  # never a moment without the old key on disk
    backup.chmod(0o600)
    return backup


def account_address(data_dir: Path) -> str:
    """The address in the keystore, without decrypting it."""
    try:
        raw = str(json.loads(account_path(data_dir).read_text())["address"])
        return str(to_checksum_address("0x" + raw.removeprefix("0x")))
    except FileNotFoundError as exc:
        raise AccountError(
            f"no account at {account_path(data_dir)} (run: intellect-node keys new)"
        ) from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise AccountError(f"{account_path(data_dir)} is not a valid keystore ({exc!r})") from exc


def load_account(data_dir: Path, password: str) -> LocalAccount:
    path = account_path(data_dir)
    try:
        keystore = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise AccountError(f"no account at {path} (run: intellect-node keys new)") from exc
    except ValueError as exc:
        raise AccountError(f"{path} is not a valid keystore ({exc})") from exc
    try:
        key = Account.decrypt(keystore, password)
    except ValueError as exc:
        raise AccountError(f"wrong password for {path}") from exc
    except (KeyError, TypeError, AttributeError) as exc:  # not the keystore layout
        raise AccountError(f"{path} is not a valid keystore ({exc!r})") from exc
    account: LocalAccount = Account.from_key(key)
    return account
