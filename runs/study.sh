#!/usr/bin/env bash
# The whole comparison in one command: every scheme x 3 seeds, length and stream evaluation, one report.
#
#   bash runs/study.sh                                   # study/ on this machine's defaults (CPU: the tiny model)
#   STUDY=study-gpu bash runs/study.sh model=small       # any train.py override applies to every run
#   SCHEMES="rope alibi" SEEDS="1 2" bash runs/study.sh  # a smaller study
#   EVAL_ARGS="eval.tokens=131072" STREAM_ARGS="eval.stream_tokens=25600" bash runs/study.sh   # eval.py overrides
#   STREAM=0 bash runs/study.sh                          # length evaluations only; a later run adds the streams
#   TAG=window64 SCHEMES=rope bash runs/study.sh model.window=64 model.window_pattern=SSSL   # a variant, beside
#                                                        # the plain runs: study/rope-window64-s<seed>
#
# It resumes where it stopped: a finished run (its DONE file) is skipped, an interrupted one resumes from its
# checkpoint, an evaluated run (eval/length.json, eval/stream.json) is neither trained nor evaluated again (a result
# cut short or damaged is evaluated again); Ctrl-C stops it where it is (runs/common.sh). So a study kept as its
# evaluations alone grows without retraining what it holds:
#   cp -r results/study-breadth study-b && STUDY=study-b SCHEMES="kerple irope" bash runs/study.sh logger.wandb=false
# Writes $STUDY/REPORT.md (the tables, with 95% intervals, and the plots) and $STUDY/eval/compare.{json,txt,png}; each
# call appends itself with every variable it ran with to $STUDY/commands.txt, which the report quotes.
# Time at the defaults, measured with two of these jobs sharing 2 CPU cores (OMP_NUM_THREADS=1 each): 8-10 min per
# training run, 1-2.5 min per length eval, 7-9 min per stream eval; six schemes x 3 seeds, about 4 hours of one
# core. On a GPU: not measured.
set -euo pipefail
cd "$(dirname "$0")/.."
STUDY=${STUDY:-study}
SCHEMES=${SCHEMES:-"learned sinusoidal alibi rope nope sink t5 kerple fire shaw fox xpos prope pope irope"}
SEEDS=${SEEDS:-"1 2 3"}
STREAM=${STREAM:-1}
TAG=${TAG:+-$TAG}  # run folders are <scheme><-TAG>-s<seed>; the report names a variant by what its config changed
PY=${PYTHON:-python}
source runs/common.sh
read -r -a eval_args <<< "${EVAL_ARGS:-}"
read -r -a stream_args <<< "${STREAM_ARGS:-}"
mkdir -p "$STUDY"
echo "STUDY=$STUDY SCHEMES=\"$SCHEMES\" SEEDS=\"$SEEDS\" STREAM=$STREAM TAG=${TAG#-} EVAL_ARGS=\"${EVAL_ARGS:-}\"" \
  "STREAM_ARGS=\"${STREAM_ARGS:-}\" bash runs/study.sh $*   # $(date -u +%F)," \
  "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" >> "$STUDY/commands.txt"

for scheme in $SCHEMES; do
  for seed in $SEEDS; do
    run="$STUDY/$scheme$TAG-s$seed"
    if [ -f "$run/DONE" ] || [ -f "$run/eval/length.json" ]; then
      echo "== $run: trained"
      continue
    fi
    resume=()
    [ -f "$run/ckpt.pt" ] && resume=(train.resume=true)
    echo "== $run: training ${resume[*]}"
    "$PY" train.py positional="$scheme" seed="$seed" out_dir="$run" logger.group="$(group "$STUDY")" "${resume[@]}" "$@"
    touch "$run/DONE"
  done
done

for scheme in $SCHEMES; do
  for seed in $SEEDS; do
    run="$STUDY/$scheme$TAG-s$seed"
    evaluated "$run/eval/length.json" || "$PY" eval.py checkpoint="$run" logger.wandb=false "${eval_args[@]}"
  done
  first="$STUDY/$scheme$TAG-s${SEEDS%% *}"  # streaming is one long stream per scheme: its first seed
  if [ "$STREAM" = 0 ] || evaluated "$first/eval/stream.json"; then
    :
  elif [ -f "$first/ckpt.pt" ]; then
    "$PY" eval.py checkpoint="$first" eval.mode=stream logger.wandb=false "${stream_args[@]}"
  else
    echo "== $first: no checkpoint left to stream (evaluations only); retrain it to add its stream"
  fi
done

"$PY" -m evaluation.study "$STUDY"
