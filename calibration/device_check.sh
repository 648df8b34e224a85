#!/usr/bin/env bash
# GPU check on one H100/H200 (under 8 minutes): calibrate compute and memory for a ~1B Llama, run a
# real BF16 training step of transformers' Llama (SDPA), print predicted vs measured step time and
# peak memory, a torch.profiler trace of the real step (device busy vs idle), the same step on
# simtrain's shipped profile of this GPU kernel by kernel, then a 30 s sustained GEMM with
# nvidia-smi's clocks (calibration/sustained.py; --sustained-s 0 skips it). Results (device_check.json,
# real_step_trace.json.gz, the log, and the calibrated profile folder) go under
# $OUT when it is set, else ./device_check_out. Extra arguments go to `python -m calibration.device_check`
# (e.g. --dry-run to rehearse on a CPU). To keep the profile: copy $OUT/profile to calibrated/<name>/ of
# the user profile directory ($SIMTRAIN_PROFILES_DIR, else ~/.local/share/simtrain/profiles on Linux) and
# use it with --set hardware.profile=<name>, or give its path: --set hardware.profile=$OUT/profile.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/device_check_out}"
export OUT
mkdir -p "$OUT"
if ! python -c "import torch" 2>/dev/null; then
  echo "device_check: torch is not installed; pip install -e '.[calibration]' (or a CUDA build of torch)" >&2
  exit 2
fi
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'devices', torch.cuda.device_count())"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv 2>/dev/null || true
timeout "${DEVICE_CHECK_TIMEOUT_S:-470}" python -m calibration.device_check --out "$OUT" "$@" 2>&1 | tee "$OUT/device_check.log"
exit "${PIPESTATUS[0]}"
