"""``intellect-node keys import``: an EVM private key from a file or stdin into the node's
encrypted keystore, without Python; garbage refused in one line; the key never printed."""

import os
import stat
import subprocess

import pytest
from eth_account import Account

from ledger.accounts import AccountError, load_account
from node.keystore import KeystoreError, parse_private_key
from tests.helpers.net import CLI

KEY = "0x" + "5c" * 31 + "01"  # a key of nobody's
ADDRESS = Account.from_key(KEY).address


def keys(*args, stdin="", password="pw"):
    env = {**os.environ, "INTELLECT_NODE_PASSWORD": password}
    return subprocess.run(
        [*CLI, "keys", *args], input=stdin, capture_output=True, text=True, env=env, timeout=60
    )


def imported(d):
    return load_account(d, "pw").address


def test_import_from_a_file(tmp_path):
    d, key_file = tmp_path / "validator", tmp_path / "key.txt"
    key_file.write_text(KEY.removeprefix("0x").upper() + "\n")  # no 0x, upper case, newline
    res = keys("import", "--data-dir", str(d), "--key-file", str(key_file))
    assert res.returncode == 0, res.stderr
    assert f"account    {ADDRESS}" in res.stdout and "peer id    12D3KooW" in res.stdout
    assert imported(d) == ADDRESS
    assert stat.S_IMODE((d / "account.json").stat().st_mode) == 0o600
    assert KEY[2:] not in res.stdout + res.stderr and KEY[2:].upper() not in res.stdout
    # an account is not replaced without --force; with it, the old one is kept aside
    res = keys("import", "--data-dir", str(d), "--key-file", str(key_file))
    assert res.returncode == 1 and "already exists (use --force" in res.stderr
    other = "0x" + "77" * 32
    res = keys("import", "--data-dir", str(d), "--force", "--key-file", "-", stdin=other)
    assert res.returncode == 0, res.stderr
    assert imported(d) == Account.from_key(other).address
    assert len(list(d.glob("account.json.bak-*"))) == 1


def test_import_from_stdin_keeps_the_node_identity(tmp_path):
    d = tmp_path / "validator"
    made = keys("new", "--data-dir", str(d))
    assert made.returncode == 0, made.stderr
    peer_id = made.stdout.split()[2]
    res = keys("import", "--data-dir", str(d), "--force", stdin=f"  {KEY}\n")
    assert res.returncode == 0, res.stderr
    assert peer_id in res.stdout  # the node key is not replaced, only the account
    assert imported(d) == ADDRESS
    assert KEY[2:] not in res.stdout + res.stderr


@pytest.mark.parametrize(
    "garbage",
    ["", "hello", KEY[:-2], KEY + "00", "0x" + "zz" * 32, "0x" + "00" * 32, "0x" + "ff" * 32],
)
def test_garbage_is_one_line_and_nothing_is_written(tmp_path, garbage):
    d = tmp_path / "validator"
    res = keys("import", "--data-dir", str(d), stdin=garbage)
    assert res.returncode == 1
    [line] = res.stderr.splitlines()
    assert line.startswith("intellect-node: error: stdin holds no private key"), line
    if len(garbage) > 8:
        assert garbage not in line and garbage[4:-4] not in line  # never quoted
    assert not d.exists()


def test_a_key_file_that_cannot_be_read_and_an_empty_password(tmp_path):
    d = tmp_path / "validator"
    res = keys("import", "--data-dir", str(d), "--key-file", str(tmp_path / "missing"))
    assert res.returncode == 1 and "cannot read the key file" in res.stderr
    res = keys("import", "--data-dir", str(d), stdin=KEY, password="")
    assert res.returncode == 1 and "empty keystore password" in res.stderr
    assert not (d / "account.json").exists()


def test_a_wrong_password_does_not_open_the_imported_account(tmp_path):
    d = tmp_path / "validator"
    pw = tmp_path / "pw.txt"
    pw.write_text("right horse\n")
    res = keys("import", "--data-dir", str(d), "--password-file", str(pw), stdin=KEY)
    assert res.returncode == 0, res.stderr
    assert load_account(d, "right horse").address == ADDRESS
    with pytest.raises(AccountError, match="wrong password"):
        load_account(d, "pw")


def test_parse_private_key():
    assert parse_private_key(f" {KEY.upper().replace('0X', '0x')}\n", "f") == KEY
    with pytest.raises(KeystoreError, match="^f holds no private key: expected 64 hex"):
        parse_private_key("0x12", "f")
    with pytest.raises(KeystoreError, match="out of secp256k1's range"):
        parse_private_key("f" * 64, "f")
