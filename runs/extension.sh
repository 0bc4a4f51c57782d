#!/usr/bin/env bash
# Context extension, measured in one command: training-free scalings against short fine-tunes, DroPE, and passkey
# retrieval, the way practitioners extend a context. It starts from the seed-1 runs of
# `bash runs/study.sh` (rope, alibi, nope), so run that first (or point BASE at folders holding rope, alibi, nope).
#
#   bash runs/extension.sh                                # ext/: every run below, then ext/REPORT.md
#   STEPS=30 DROPE_STEPS=20 PASSKEY_STEPS=40 EXT=ext-quick bash runs/extension.sh     # a quick pass
#   EVAL_ARGS="eval.tokens=131072" bash runs/extension.sh # eval.py overrides for every length evaluation
#   PASSKEY_ARGS="eval.trials=100" bash runs/extension.sh # and for every passkey evaluation
#
# 1. the RoPE base, training-free: eval.rope_scaling=all (PI, NTK, dynamic NTK, YaRN, and LongRoPE, whose factors
#    are searched first for each length past training), eval.rerope (ReRoPE, Leaky ReRoPE) and eval.log_scaling;
# 2. fine-tuned at 4x the length for STEPS steps (same tokens per step as the base): YaRN x4, PI x4, unscaled;
# 3. DroPE: the RoPE base with its rotation dropped, recalibrated at the original length for DROPE_STEPS steps
#    (init_from=... positional=nope), scored zero-shot with and without log-length scaling; against a NoPE model
#    trained from scratch for the base's steps plus DROPE_STEPS (the same tokens in all);
# 4. passkey: each of rope, rope+YaRN fine-tuned, DroPE, alibi, nope learns the task at its own training length
#    in PASSKEY_STEPS steps at the base length, more at a longer one (as many samples: below), then
#    eval.mode=passkey at LENGTHS. The fine-tunes learn QK-norm gains (model.qk_norm=learned; step 0 is still the
#    gain-free base): under the base's gain-free cap (logits within +-sqrt(head dim)) the rotary models' heads
#    stayed too flat to copy the key, and with the gains RoPE had learned only part of the retrieval by 600 steps
#    (dev/LOG.md, 2026-11-25). PASSKEY_QK=rms repeats the gain-free fine-tunes, as <run>-passkey-rms.
# 5. RoPE's passkey model scored under the training-free extensions (ReRoPE, Leaky ReRoPE, YaRN, NTK).
# Every length evaluation scores the same held-out tokens at the same LENGTHS, so one table compares them all.
# Resumes like runs/study.sh: a run with a DONE file is skipped, an interrupted one resumes from its checkpoint,
# an evaluated one is not evaluated again. Each call appends itself with every variable to $EXT/commands.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${BASE:-study}
EXT=${EXT:-ext}
PY=${PYTHON:-python}
source runs/common.sh
STEPS=${STEPS:-200}
DROPE_STEPS=${DROPE_STEPS:-60}
PASSKEY_STEPS=${PASSKEY_STEPS:-1200}
LENGTHS=${LENGTHS:-"[256,512,1024,2048,4096]"}
PASSKEY_QK=${PASSKEY_QK:-learned}
read -r -a eval_args <<< "${EVAL_ARGS:-}"
read -r -a passkey_args <<< "${PASSKEY_ARGS:-}"
mkdir -p "$EXT"
echo "BASE=$BASE EXT=$EXT STEPS=$STEPS DROPE_STEPS=$DROPE_STEPS PASSKEY_STEPS=$PASSKEY_STEPS LENGTHS=\"$LENGTHS\"" \
  "PASSKEY_QK=$PASSKEY_QK EVAL_ARGS=\"${EVAL_ARGS:-}\" PASSKEY_ARGS=\"${PASSKEY_ARGS:-}\" bash runs/extension.sh $*" \
  "  # $(date -u +%F), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" >> "$EXT/commands.txt"

base_run() {  # the study's seed-1 run of a scheme, linked (not copied) into $EXT/<scheme>
  local scheme=$1 from="$BASE/$1-s1"
  [ -f "$from/DONE" ] || from="$BASE/$1"
  if [ ! -f "$from/ckpt.pt" ]; then
    echo "error: no trained $scheme run in $BASE ($BASE/$scheme-s1 or $BASE/$scheme); run bash runs/study.sh first" >&2
    exit 2
  fi
  mkdir -p "$EXT/$scheme"
  [ -f "$EXT/$scheme/ckpt.pt" ] || ln "$from/ckpt.pt" "$EXT/$scheme/ckpt.pt" 2>/dev/null || cp "$from/ckpt.pt" "$EXT/$scheme/"
}

train() {  # train <out_dir> <overrides...>
  local run=$1
  shift
  [ -f "$run/DONE" ] && return
  local resume=()
  [ -f "$run/ckpt.pt" ] && resume=(train.resume=true)
  echo "== $run: training ${resume[*]}"
  "$PY" train.py out_dir="$run" logger.wandb=false logger.group="$(group "$EXT")" "${resume[@]}" "$@"
  touch "$run/DONE"
}

length_eval() {  # length_eval <run> <overrides...>
  local run=$1
  shift
  evaluated "$run/eval/length.json" || "$PY" eval.py checkpoint="$run" eval.lengths="$LENGTHS" logger.wandb=false \
    "${eval_args[@]}" "$@"
}

for scheme in rope alibi nope; do base_run "$scheme"; done
base_steps=$("$PY" -c "import sys, torch; print(torch.load(sys.argv[1], map_location='cpu', mmap=True)['step'])" \
  "$EXT/rope/ckpt.pt")
at4x=(train.seq_len=1024 train.batch_size=8 train.max_steps="$STEPS")  # 8 x 1024 = the base's 32 x 256 tokens

train "$EXT/rope-yarn4" init_from="$EXT/rope" "${at4x[@]}" positional.scaling=yarn positional.scaling_factor=4
train "$EXT/rope-pi4" init_from="$EXT/rope" "${at4x[@]}" positional.scaling=linear positional.scaling_factor=4
train "$EXT/rope-1024" init_from="$EXT/rope" "${at4x[@]}"
train "$EXT/drope" init_from="$EXT/rope" positional=nope train.max_steps="$DROPE_STEPS"
train "$EXT/nope-scratch" positional=nope train.max_steps=$((base_steps + DROPE_STEPS))

train_len=$("$PY" -c "import sys, torch; print(torch.load(sys.argv[1], map_location='cpu', mmap=True)['seq_len'])" \
  "$EXT/rope/ckpt.pt")
for n in ${LENGTHS//[\[\],]/ }; do  # LongRoPE's factors, searched for each length past training (eval.py's `all` then
  factor=$("$PY" -c "print(f'{$n / $train_len:g}')")  # scores them beside the closed-form scalings)
  windows=$(( 16384 / n < 8 ? 16384 / n : 8 ))  # at most 16K fitness tokens: the held-out text the table leaves
  windows=$(( windows < 1 ? 1 : windows ))      # unread holds only 4 windows of 4096 (eval.py's default table)
  [ "$n" -le "$train_len" ] || [ -f "$EXT/rope/longrope_x$factor.json" ] || "$PY" -m evaluation.longrope_search \
    checkpoint="$EXT/rope" target_length="$n" eval.lengths="$LENGTHS" search.windows="$windows" "${eval_args[@]}"
done
length_eval "$EXT/rope" eval.rope_scaling=all eval.log_scaling=true eval.rerope=true
for run in rope-yarn4 rope-pi4 rope-1024 nope-scratch; do length_eval "$EXT/$run"; done
length_eval "$EXT/drope" eval.log_scaling=true

# A fine-tune at length L reads samples of min_tokens..L tokens, so at equal tokens per step it reads
# (min_tokens + train_len) / (min_tokens + L) as many as one at the base length: it takes that many times the steps,
# and every model reads about as many samples (RoPE+YaRN at 1024: 1200 x 1088 / 320 = 4080 steps).
min_tokens=$("$PY" -c "from data.passkey import PasskeyData; print(PasskeyData.min_tokens)")
passkey() {  # passkey <run> <overrides...>: learn the task from <run>'s weights at its own length, then score it
  local run=$1 out="$EXT/$1-passkey" length=$train_len arg
  shift
  for arg in "$@"; do [[ $arg == train.seq_len=* ]] && length=${arg#train.seq_len=}; done
  local steps=$(( PASSKEY_STEPS * (min_tokens + length) / (min_tokens + train_len) ))
  [ "$PASSKEY_QK" = learned ] || out="$out-$PASSKEY_QK"
  train "$out" init_from="$EXT/$run" data=passkey train.max_steps="$steps" model.qk_norm="$PASSKEY_QK" "$@"
  passkey_eval "$out"
}
passkey_eval() {  # passkey_eval <run> [eval.rope_scaling=<kind>]: eval.mode=passkey at LENGTHS, once
  local run=$1 file=passkey.json
  [ $# -lt 2 ] || file="passkey-${2#eval.rope_scaling=}.json"
  evaluated "$run/eval/$file" || "$PY" eval.py checkpoint="$run" eval.mode=passkey eval.lengths="$LENGTHS" \
    logger.wandb=false "${passkey_args[@]}" "${@:2}"
}
passkey rope
passkey rope-yarn4 train.seq_len=1024 train.batch_size=8 positional.scaling=yarn positional.scaling_factor=4
passkey drope positional=nope
passkey alibi positional=alibi
passkey nope positional=nope

# 5. RoPE's passkey model (4.) under the training-free extensions: does ReRoPE's or YaRN's reach in perplexity
#    carry over to retrieval? (With the gains only: the gain-free RoPE never learned the task.)
if [ "$PASSKEY_QK" = learned ]; then
  for kind in rerope leaky_rerope yarn ntk; do passkey_eval "$EXT/rope-passkey" eval.rope_scaling="$kind"; done
fi

"$PY" -m evaluation.study "$EXT"
