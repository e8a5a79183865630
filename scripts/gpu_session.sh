#!/usr/bin/env bash
# The GPU checks of docs/gpu.md in one command, on an offline CUDA machine with Python 3.12 and a
# CUDA torch (../shared/gpu/README.md), and the same steps on a CPU as a dry run:
#
#   bash scripts/gpu_session.sh prepare          # where the package registry is reachable, in the project's root:
#                                                # wheels + Qwen2.5 tokenizer into .gpu/ (git-ignored; carry it along)
#   OUT=/some/dir bash scripts/gpu_session.sh run [tests] [bench]   # on the GPU machine, from the project's root
#   OUT=/some/dir bash scripts/gpu_session.sh dry-run                # on a CPU: the same sections, engine.compile=static
#
# `run` installs .gpu/whl with --no-deps (the machine's own numpy, pandas, tqdm, tokenizers,
# huggingface-hub, safetensors, regex... stay; the bundle carries what it lacks: transformers in
# the project's range, hydra-core, omegaconf, antlr4, greenlet, math-verify, pytest); a failed install
# stops the session in one line. Then scripts/gpu_preflight.py imports everything the sections
# import and stops the session in one line naming what is missing. Then the sections, each under
# its own `timeout`: tests (`pytest -m gpu` of the GPU tests) and bench (scripts/bench_gpu.py on
# random weights of the R-Stitch pair's shapes; bench_gpu.json is rewritten after every part, and a
# run cut short by its limit prints what it measured). Everything lands in $OUT: install.txt,
# preflight.txt, env.txt, pytest_gpu.txt, bench_gpu.txt/.err/.json.
#
# Time limits (seconds): INSTALL_S 60, PREFLIGHT_S 60, TESTS_S 120, BENCH_S 340; their sum for the
# sections asked for must fit SESSION_S (590: one 600 s command), else the session refuses to
# start. BENCH_ARGS replaces the benchmark's options (default: 128 tokens per measurement, batch
# sizes 1 and 8; the graphs path before the eager one, HF generate eager before compiled, so a run
# cut short has measured the new path first).
set -uo pipefail
cmd=${1:-}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
python=${PYTHON:-python3}
bundle=${GPU_BUNDLE:-.gpu}  # what `prepare` writes (another directory for tests)
fail() { echo "gpu_session: $*" >&2; exit 2; }

if [ "$cmd" = prepare ]; then
  set -e
  bash ../shared/gpu/bundle.sh "$bundle"
  cp ../shared/gpu/make_shapes.py "$bundle/"
  # pytest with its own requirements, so that the tests section never depends on the machine's version; pebble, the grader's pool
  "$python" -m pip download -q --no-deps --only-binary=:all: -d "$bundle/whl" "pytest>=8,<9" pluggy iniconfig packaging "pebble>=5.2,<6"
  exclude=$(git rev-parse --git-path info/exclude)
  grep -qx "/$bundle/" "$exclude" 2>/dev/null || echo "/$bundle/" >> "$exclude"   # ignored here, so that it is carried explicitly
  du -sh "$bundle"
  exit 0
fi

case "$cmd" in
  run) device=cuda ;;
  dry-run) device=cpu ;;
  *) fail "usage: gpu_session.sh prepare | run [tests] [bench] | dry-run (got '${cmd}')" ;;
esac
shift
sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(tests bench)
budget=$(( ${INSTALL_S:=60} + ${PREFLIGHT_S:=60} ))
for section in "${sections[@]}"; do
  case "$section" in
    tests) budget=$((budget + ${TESTS_S:=120})) ;;
    bench) budget=$((budget + ${BENCH_S:=340})) ;;
    *) fail "unknown section '$section' (tests, bench)" ;;
  esac
done
[ "$budget" -le "${SESSION_S:=590}" ] || fail "the time limits of ${sections[*]} add up to ${budget} s, over SESSION_S=${SESSION_S} s (one command's time): lower TESTS_S/BENCH_S or run the sections in separate commands"
out=${OUT:?set OUT to the results directory}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

if [ "$cmd" = run ]; then
  compgen -G "$bundle/whl/*.whl" > /dev/null || fail "no wheels in $bundle/whl: run 'bash scripts/gpu_session.sh prepare' where the package registry is reachable, and carry $bundle along"
  site=$(mktemp -d)
  echo "== install ($bundle/whl, --no-deps)"
  timeout "$INSTALL_S" "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$bundle"/whl/*.whl \
    > "$out/install.txt" 2>&1 || fail "installing the bundled wheels failed (exit $?): $(grep -v '^\s*$' "$out/install.txt" | tail -1)"
  export PYTHONPATH="$site:$root"
  tokenizer=(--tokenizer "$bundle/tok")
  files=("$bundle/tok")
  default_bench=(--tokens 128 --batch-sizes 1 8)
else
  export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
  tokenizer=()
  files=()
  default_bench=(--tiny --dtype float32 --tokens 16 --batch-sizes 1 4 --hf eager)
fi

echo "== preflight"
timeout "$PREFLIGHT_S" "$python" scripts/gpu_preflight.py --device "$device" --files "${files[@]}" > "$out/preflight.txt" 2>&1
status=$?
cat "$out/preflight.txt"
[ $status -eq 0 ] || exit 2
{
  [ "$device" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$python" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| transformers', transformers.__version__)"
  git -C "$root" log -1 --format='commit %H %s' 2>/dev/null || true
  date -u
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

failed=()
for section in "${sections[@]}"; do
  start=$SECONDS
  if [ "$section" = tests ]; then
    echo "== pytest -m gpu (limit ${TESTS_S} s)"
    timeout "$TESTS_S" "$python" -m pytest -m gpu -p no:cacheprovider -q -rs --durations=5 \
      tests/engines/test_gpu_paths.py tests/engines/test_static_cache.py > "$out/pytest_gpu.txt" 2>&1
    status=$?
    echo "exit $status" >> "$out/pytest_gpu.txt"
    tail -15 "$out/pytest_gpu.txt"
  else
    echo "== bench_gpu.py (limit ${BENCH_S} s)"
    if [ -n "${BENCH_ARGS:-}" ]; then read -r -a bench_args <<< "$BENCH_ARGS"; else bench_args=("${default_bench[@]}"); fi
    timeout "$BENCH_S" "$python" scripts/bench_gpu.py --random-weights --device "$device" "${tokenizer[@]}" \
      --json "$out/bench_gpu.json" "${bench_args[@]}" > "$out/bench_gpu.txt" 2> "$out/bench_gpu.err"
    status=$?
    echo "exit $status" >> "$out/bench_gpu.txt"
    tail -40 "$out/bench_gpu.txt"
    tail -5 "$out/bench_gpu.err"
  fi
  echo "== $section: exit $status, $((SECONDS - start)) s"
  [ $status -eq 0 ] || failed+=("$section (exit $status$([ $status -eq 124 ] && echo ': over its time limit'))")
done
[ ${#failed[@]} -eq 0 ] || { echo "gpu_session: failed: ${failed[*]}" >&2; exit 1; }
echo "gpu_session: ${sections[*]} passed (${SECONDS} s)"
