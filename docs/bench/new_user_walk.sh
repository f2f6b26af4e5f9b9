#!/usr/bin/env bash
# Issue 40's new-user walk: the wheel installed outside the repository into a fresh virtualenv,
# run with an empty HOME (no data setting, no build cache, no network but the package index),
# then docs/bench/new_user_walk.py twice (first: builds included; second: cached).
# Usage: docs/bench/new_user_walk.sh WORKDIR MIRROR   (MIRROR: a directory in the data layout,
# e.g. ../shared/data)
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
work="$1"; mirror="$(cd "$2" && pwd)"
rm -rf "$work" && mkdir -p "$work/home" "$work/run"
python3 -m pip wheel "$repo" --no-deps -w "$work/dist" -q
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q torch==2.13.0
"$work/venv/bin/pip" install -q "$work"/dist/pyro_bnnlv-*.whl
cd "$work/run"
for run in first second; do
  echo "== $run run"
  /usr/bin/time -f "wall %e s" env -i PATH=/usr/bin:/bin HOME="$work/home" \
    "$work/venv/bin/python" "$repo/docs/bench/new_user_walk.py" "$mirror" 2>&1 | grep -a "\[walk\]\|^wall\|Error"
done
