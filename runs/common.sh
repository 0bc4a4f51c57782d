# What runs/study.sh, runs/tasks.sh and runs/extension.sh do alike; each sources this file after setting PY.
#
# A stop (Ctrl-C, or SIGTERM to the script's process group, as timeout and SLURM send it) ends the script once the run
# under way has saved (train.py) or stopped: no later run starts and the stopped one is not marked DONE, so the same
# command goes on where it stopped.
trap 'echo "stopped: run the same command again to go on where it stopped" >&2; exit 130' INT TERM

# evaluated <result file>: whether it holds a whole result; one cut short or damaged is named and scored again
evaluated() {
  [ -f "$1" ] || return 1
  local why
  if why=$("$PY" -c 'import sys; from evaluation.report import read_result; from utils.errors import cli
cli(lambda: read_result(sys.argv[1]))' "$1" 2>&1); then
    return 0
  fi
  echo "== ${why#error: }: scoring it again" >&2
  return 1
}

# group <folder>: the wandb group of the folder's runs, its name (a path may be absolute; a group holds no /)
group() {
  local folder=${1%/}
  echo "${folder##*/}"
}
