#!/usr/bin/env bash
# Runs encoderx training on a Cloud TPU VM (one host or a pod slice): creates the TPU (a
# TPU VM, or a queued resource with --queued), installs this checkout (git HEAD) on every
# worker, starts the same training command on all workers, streams worker 0's log until
# the run ends, then deletes the TPU (unless --keep).
#
# Usage:
#   bash launch/tpu.sh --name=NAME --zone=ZONE --type=ACCELERATOR_TYPE [options] -- TRAIN_ARGS
# e.g.
#   bash launch/tpu.sh --name=bert-base --zone=us-central2-b --type=v4-32 -- \
#     --config=configs/bert.py:base --workdir=/mnt/shared/runs/bert_base \
#     --config.data.files='/mnt/shared/corpus/*.txt' --config.data.streaming=True
#
# Options:
#   --project=P       gcloud project (default: gcloud's configured one)
#   --runtime=V       TPU software version (default: by type: v4 tpu-ubuntu2204-base,
#                     v5litepod v2-alpha-tpuv5-lite, v5p v2-alpha-tpuv5, v6e v2-alpha-tpuv6e)
#   --queued          create a queued resource (waits for capacity) instead of a TPU VM
#   --spot            spot capacity (preemptible; the run saves a checkpoint on SIGTERM and
#                     continues with --resume)
#   --reuse           the TPU exists already: skip creating it
#   --keep            do not delete the TPU at the end
#   --python=P        the Python the workers build .venv with (default python3.11,
#                     installed from the deadsnakes PPA when missing)
#   --dry_run         print the commands (gcloud, git archive) instead of running them
# TRAIN_ARGS go to `python -m encoderx.train` on every worker (see docs/guides/tpu-pods.md);
# each worker's output is in ~/encoderx-train.log there.
set -euo pipefail

name="" zone="" type="" project="" runtime="" queued=0 spot=0 reuse=0 keep=0 dry_run=0
python="python3.11"
usage() {  # the header above; on stderr for a mistake
  if [ "${1:-2}" = 0 ]; then sed -n '2,27p' "$0"; else sed -n '2,27p' "$0" >&2; fi
  exit "${1:-2}"
}
while [ $# -gt 0 ]; do
  case "$1" in
    --name=*) name="${1#*=}" ;;
    --zone=*) zone="${1#*=}" ;;
    --type=*) type="${1#*=}" ;;
    --project=*) project="${1#*=}" ;;
    --runtime=*) runtime="${1#*=}" ;;
    --python=*) python="${1#*=}" ;;
    --queued) queued=1 ;;
    --spot) spot=1 ;;
    --reuse) reuse=1 ;;
    --keep) keep=1 ;;
    --dry_run) dry_run=1 ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    *) echo "launch/tpu.sh: unknown option '$1' (training flags go after --)" >&2; usage ;;
  esac
  shift
done
train_args=("$@")
for required in name zone type; do
  if [ -z "${!required}" ]; then
    echo "launch/tpu.sh: --$required is required" >&2
    usage
  fi
done
if [ ${#train_args[@]} -eq 0 ]; then
  echo "launch/tpu.sh: give the training flags after --, e.g. -- --config=configs/bert.py:base" \
       "--workdir=gs://BUCKET/runs/NAME" >&2
  usage
fi
if [ -z "$runtime" ]; then
  case "$type" in
    v4-*) runtime="tpu-ubuntu2204-base" ;;
    v5litepod-*|v5e-*) runtime="v2-alpha-tpuv5-lite" ;;
    v5p-*) runtime="v2-alpha-tpuv5" ;;
    v6e-*) runtime="v2-alpha-tpuv6e" ;;
    *) echo "launch/tpu.sh: no default runtime for --type=$type; give --runtime" >&2; exit 2 ;;
  esac
fi
type="${type/#v5e-/v5litepod-}"  # gcloud's name of v5e slices

# One shell word: as it is when it is plain, else in single quotes (as Python's shlex.quote).
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\"\'\"\'}"
  fi
}

# Runs a command, or prints it (one line, each word quoted) with --dry_run.
run() {
  if [ "$dry_run" = 1 ]; then
    local words=() word
    for word in "$@"; do words+=("$(quote "$word")"); done
    echo "${words[*]}"
  else
    "$@"
  fi
}

where=(--zone="$zone")
[ -n "$project" ] && where+=(--project="$project")
tpu_vm=(gcloud compute tpus tpu-vm)
on_all=("${tpu_vm[@]}" ssh "$name" "${where[@]}" --worker=all --command)
on_first=("${tpu_vm[@]}" ssh "$name" "${where[@]}" --worker=0 --command)

delete_tpu() {
  if [ "$queued" = 1 ]; then
    run gcloud compute tpus queued-resources delete "$name" "${where[@]}" --force --quiet
  else
    run "${tpu_vm[@]}" delete "$name" "${where[@]}" --quiet
  fi
}

if [ "$reuse" = 0 ]; then
  capacity=()
  [ "$spot" = 1 ] && capacity+=(--spot)
  if [ "$queued" = 1 ]; then
    run gcloud compute tpus queued-resources create "$name" --node-id="$name" "${where[@]}" \
      --accelerator-type="$type" --runtime-version="$runtime" "${capacity[@]}"
  else
    run "${tpu_vm[@]}" create "$name" "${where[@]}" --accelerator-type="$type" \
      --version="$runtime" "${capacity[@]}"
  fi
fi
# From here on the TPU exists: delete it however the script ends (unless --keep).
if [ "$keep" = 0 ]; then
  trap delete_tpu EXIT
fi
if [ "$queued" = 1 ] && [ "$reuse" = 0 ]; then
  state=(gcloud compute tpus queued-resources describe "$name" "${where[@]}"
         --format='value(state.state)')
  if [ "$dry_run" = 1 ]; then
    run "${state[@]}"
  else
    echo "launch/tpu.sh: waiting for the queued resource $name to become ACTIVE"
    # A request that capacity will never meet ends FAILED or SUSPENDED: stop waiting.
    while :; do
      current="$("${state[@]}")"
      case "$current" in
        ACTIVE) break ;;
        FAILED|SUSPENDED|SUSPENDING)
          echo "launch/tpu.sh: the queued resource $name is $current; see" \
               "'gcloud compute tpus queued-resources describe $name'" >&2
          exit 1 ;;
      esac
      sleep 30
    done
  fi
fi

# The code: this checkout's HEAD (commit first: uncommitted changes are not shipped).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
archive="/tmp/encoderx-$name.tar.gz"
run git archive --format=tar.gz --output="$archive" HEAD
run "${tpu_vm[@]}" scp "$archive" "$name:encoderx.tar.gz" "${where[@]}" --worker=all
install="set -e; if ! command -v $python >/dev/null; then"
install+=" sudo add-apt-repository -y ppa:deadsnakes/ppa && sudo apt-get update -q"
install+=" && sudo apt-get install -y -q $python ${python}-venv; fi"
install+="; rm -rf encoderx && mkdir encoderx && tar -xzf encoderx.tar.gz -C encoderx"
install+=" && cd encoderx && PYTHON=$python bash launch/setup.sh \"\""
install+=" && .venv/bin/pip install --quiet \"jax[tpu]==0.10.2\""
run "${on_all[@]}" "$install"

# The run: the same command on every worker (one JAX process each; encoderx initializes
# jax.distributed itself on a TPU VM), detached so that an ssh drop does not stop it.
train="TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python -m encoderx.train"
for word in "${train_args[@]}"; do train+=" $(quote "$word")"; done
train+="; echo \$? > ~/encoderx-train.rc"
start="cd encoderx && rm -f ~/encoderx-train.rc && (nohup setsid bash -c $(quote "$train")"
start+=" > ~/encoderx-train.log 2>&1 < /dev/null &)"
run "${on_all[@]}" "$start"
# Worker 0's log until its run ends, then every worker's exit status.
follow="until [ -f ~/encoderx-train.log ]; do sleep 1; done; tail -n +1 -f ~/encoderx-train.log &"
follow+=" until [ -f ~/encoderx-train.rc ]; do sleep 5; done; sleep 2; kill \$!"
run "${on_first[@]}" "$follow"
run "${on_all[@]}" 'echo "$(hostname): exit status $(cat ~/encoderx-train.rc)"'
