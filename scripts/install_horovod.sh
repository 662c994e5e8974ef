#!/usr/bin/env bash
# Install the prebuilt Horovod wheel (../shared/wheels) into the active venv when it fits this stack (Python 3.11,
# torch 2.13.0): --no-deps, sha256 checked against the wheels README, torch never touched. Quick when already
# installed; prints why it skipped otherwise (exit 0). Exits non-zero only when a fitting wheel fails to install.
# Set PETASTORM_BALANCED_WHEELS to look in another folder. Logic: scripts/horovod_wheel.py.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python scripts/horovod_wheel.py "$@"
