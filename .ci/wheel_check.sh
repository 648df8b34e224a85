#!/usr/bin/env bash
# Issue 30: simtrain works as a normal (non-editable) package. Build the wheel, install it with its
# dependencies into a fresh venv in a temp dir outside the checkout (no --system-site-packages: that
# would see the editable install), and run what a new user runs from another folder: `simtrain hardware`
# (the built-in profiles are package data), `simtrain simulate` on an example copied out of the checkout,
# and `simtrain calibrate --device cpu --quick --no-collectives --config tiny.yaml` writing into
# $SIMTRAIN_PROFILES_DIR (a temp dir).
# torch==2.13.0 is named beside the extra (pip's find-links hold torch-2.13.0+cpu), so the extra's torch
# range resolves to the CPU build and never pulls a CUDA one.
set -euo pipefail
unset PYTHONPATH  # the venv must import the installed wheel, not a checkout
cd "$(dirname "$0")/.."
start=$SECONDS
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT  # the venv holds torch: ~1 GB of files, tens of seconds to delete on a loaded VM

# built from a copy of the sources: an in-tree build leaves build/lib behind, and setuptools packs files
# that linger there after they left the source tree. The build backend (setuptools, wheel) is the one the
# dev install already has: no isolated build env
mkdir "$tmp/src"
cp -r pyproject.toml README.md simtrain calibration "$tmp/src/"
find "$tmp/src" -name __pycache__ -prune -exec rm -rf {} +
python -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/dist" "$tmp/src"
wheel=("$tmp"/dist/simtrain-*.whl)
# a venv without pip of its own (ensurepip alone took 40 s on the loaded CI machine): this pip installs into
# it (`pip --python`, pip >= 22.3); no byte-compiling of torch's files (another ~40 s); one resolution
python -m venv --without-pip "$tmp/venv"
py="$tmp/venv/bin/python"
python -m pip --python "$py" install -q --no-compile "torch==2.13.0" "${wheel[0]}[calibration]"
echo "wheel check: built and installed in $((SECONDS - start)) s"

cp examples/llama3_8b_h100_fsdp.yaml "$tmp/run.yaml"
# the calibration smoke measures the tests' 2-layer Llama (tests/calibration/data/tiny_llama.yaml): the
# wheel's calibrate command, torch and the profile writer are what it checks, and the default 16M model's
# quick compute part took 32 s against 15 s for this one (on CI's critical path)
cp tests/calibration/data/tiny_llama.yaml "$tmp/tiny.yaml"
cd "$tmp"
export SIMTRAIN_PROFILES_DIR="$tmp/profiles"
"$py" -c "import simtrain, sys; sys.exit('simtrain imported from the checkout: ' + simtrain.__file__
                                          if '/site-packages/' not in simtrain.__file__ else 0)"
venv/bin/simtrain hardware > hardware.txt
for name in h100-sxm dgx-h100 gb200-nvl72; do
  grep -q "name=$name," hardware.txt || { echo "simtrain hardware does not list $name" >&2; exit 1; }
done
venv/bin/simtrain simulate run.yaml --json > sim.json
"$py" -c "import json; r = json.load(open('sim.json')); assert r['step_time_s'] > 0, r"
# compute only: the gloo collectives' measurement (its own subprocesses, ~10 s alone, more beside the figures
# stage) runs from the checkout in the timing stage's full CPU-loop calibration; here its module must import
"$py" -c "import calibration.collectives"
venv/bin/simtrain calibrate --device cpu --quick --no-collectives --config tiny.yaml --out ci-smoke --json > calibrate.json
"$py" -c "import json, pathlib; r = json.load(open('calibrate.json')); p = pathlib.Path(r['profile'])
assert p == pathlib.Path('$tmp/profiles/calibrated/ci-smoke/profile.yaml') and p.is_file(), r"
echo "wheel check: passed in $((SECONDS - start)) s"
