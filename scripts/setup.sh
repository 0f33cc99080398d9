#!/usr/bin/env bash
# Installs everything intellect-node needs on a bare Debian machine with Python 3.11+:
# the C toolchain and GMP headers that py-libp2p's fastecdsa compiles against, a virtual
# environment in .venv, and the project with its dev extras. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(gcc)
[ -f /usr/include/gmp.h ] || [ -f /usr/include/x86_64-linux-gnu/gmp.h ] || [ -f /usr/include/aarch64-linux-gnu/gmp.h ] || need_apt+=(libgmp-dev)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
command -v npm >/dev/null 2>&1 || need_apt+=(nodejs npm)  # anvil, a development EVM node, comes from npm
# a real browser for the dashboard's test (tests/test_dashboard_browser.py), driven by Selenium
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
[ -x /usr/bin/chromedriver ] || need_apt+=(chromium-driver)
# network namespaces with a NAT for the reachability test (tests/test_nat.py)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v nft >/dev/null 2>&1 || need_apt+=(nftables)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing system packages: ${need_apt[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" python3-dev
fi

python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
    || { echo "setup: Python 3.11 or newer is required" >&2; exit 1; }
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first, pinned: 2.13.0 is the CPU build this project's machines carry; letting
# pip pick from the project's range would pull a multi-GB CUDA build.
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[dev]'
# py-libp2p depends on trio-typing, whose trio-stubs describe a trio before 0.23 (no
# trio.TaskStatus, no abandon_on_cancel) and shadow the types trio ships itself: mypy
# (pyproject.toml) reads trio's own. trio_typing, which py-libp2p imports, stays.
rm -rf .venv/lib/python3*/site-packages/trio-stubs
# anvil (Foundry's development node) for the ledger's tests and `--chain` comparisons;
# the npm package ships the binary, so nothing is downloaded outside the registry.
if [ ! -x .tools/node_modules/.bin/anvil ]; then
    npm install --prefix .tools --no-audit --no-fund --loglevel=error @foundry-rs/anvil@1.7.1
fi
# the project's git hooks (scripts/hooks/: commit subjects of at most 72 characters)
if git rev-parse --git-dir >/dev/null 2>&1; then
    git config core.hooksPath scripts/hooks
fi
echo "setup: done (.venv/bin/intellect-node)"
