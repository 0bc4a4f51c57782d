#!/usr/bin/env bash
# The length-generalization battery in one command: for each task of BATTERY (data/tasks.py), the core schemes and
# their random-position variants x 3 seeds, each trained on that task alone at short lengths and scored by exact
# match to 8x (eval.py eval.mode=tasks); one table and heatmap per task.
#
#   bash runs/tasks.sh                                     # tasks/ on this machine's defaults (experiment=tasks)
#   SCHEMES="rope alibi" RANDOMIZED=rope SEEDS=1 bash runs/tasks.sh   # a smaller battery
#   BATTERY="copy reverse mqar" bash runs/tasks.sh train.max_steps=3000 model=small   # more tasks, a larger recipe
#   SCHEMES= RANDOMIZED= PRESETS=gemma3 bash runs/tasks.sh # one layout preset alone (configs/experiment)
#
# One task per run: the tiny model learns copy or reverse alone in 1,000 steps, and a mixture of tasks far more
# slowly (dev/LOG.md). Each run is scored as soon as it is trained. It resumes where it stopped: a finished run (its
# DONE file) is not trained again, an interrupted one resumes from its checkpoint, an evaluated one (eval/tasks.json)
# is not evaluated again (one whose eval/tasks.json is cut short or damaged is); Ctrl-C stops it where it is
# (runs/common.sh). A random-position variant (Ruoss et al. 2023) trains at positions drawn from range(RANGE)
# (data.random_positions; a learned table that large). A preset of PRESETS (configs/experiment: layouts of
# windowed and global layers) trains over the battery's recipe, experiment=[tasks,<preset>]. Runs go to
# <TASKS>/<task>/<scheme>[-random]-s<seed> and <TASKS>/<task>/<preset>-s<seed>; the report to
# <TASKS>/eval/tasks.{json,txt,png} and <TASKS>/REPORT.md, which labels a preset by the settings it changes; each
# call appends itself with every variable it ran with to <TASKS>/commands.txt, which the report quotes.
set -euo pipefail
cd "$(dirname "$0")/.."
TASKS=${TASKS:-tasks}
BATTERY=${BATTERY:-"copy reverse"}
SCHEMES=${SCHEMES-"learned sinusoidal alibi rope nope t5 fire kerple cope stickbreaking path"}  # SCHEMES= (empty): none
RANDOMIZED=${RANDOMIZED-"learned sinusoidal alibi rope"}  # RANDOMIZED= (empty): no random-position runs
PRESETS=${PRESETS-"rnope_swa gemma3 llama4"}  # PRESETS= (empty): none
SEEDS=${SEEDS:-"1 2 3"}
RANGE=${RANGE:-1024}  # above the longest test sample of every task (data/tasks.py: 743 tokens, vt at n=128)
PY=${PYTHON:-python}
source runs/common.sh
mkdir -p "$TASKS"
echo "TASKS=$TASKS BATTERY=\"$BATTERY\" SCHEMES=\"$SCHEMES\" RANDOMIZED=\"$RANDOMIZED\" PRESETS=\"$PRESETS\"" \
  "SEEDS=\"$SEEDS\" RANGE=$RANGE EXPERIMENT=${EXPERIMENT:-tasks} bash runs/tasks.sh $*   # $(date -u +%F)," \
  "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" >> "$TASKS/commands.txt"

train() {  # run folder, then train.py overrides
  local run=$1
  shift
  if [ -f "$run/DONE" ]; then
    echo "== $run: trained"
    return
  fi
  local resume=()
  [ -f "$run/ckpt.pt" ] && resume=(train.resume=true)
  echo "== $run: training ${resume[*]}"
  "$PY" train.py experiment="${EXPERIMENT:-tasks}" out_dir="$run" logger.group="$(group "$TASKS")" "${resume[@]}" "$@"
  touch "$run/DONE"
}

evaluate() {  # run folder, seed: scored as soon as it is trained, so a battery stopped midway has a report of what ran;
  # on held-out samples of its own seed's draw (eval.seed), so the seeds of a group are independent trials
  evaluated "$1/eval/tasks.json" || "$PY" eval.py checkpoint="$1" eval.mode=tasks eval.seed="$2" logger.wandb=false
}

for seed in $SEEDS; do
  for task in $BATTERY; do
    for scheme in $SCHEMES; do
      run="$TASKS/$task/$scheme-s$seed"
      train "$run" data.tasks="[$task]" positional="$scheme" seed="$seed" "$@"
      evaluate "$run" "$seed"
    done
    for scheme in $RANDOMIZED; do
      table=()
      [ "$scheme" = learned ] && table=(positional.max_positions="$RANGE")
      run="$TASKS/$task/$scheme-random-s$seed"
      train "$run" data.tasks="[$task]" positional="$scheme" seed="$seed" data.random_positions="$RANGE" \
        "${table[@]}" "$@"
      evaluate "$run" "$seed"
    done
    for preset in $PRESETS; do
      run="$TASKS/$task/$preset-s$seed"
      EXPERIMENT="[tasks,$preset]" train "$run" data.tasks="[$task]" seed="$seed" "$@"
      evaluate "$run" "$seed"
    done
  done
done
"$PY" -m evaluation.tasks "$TASKS"
