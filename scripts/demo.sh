#!/usr/bin/env bash
# The whole story on one machine, in about 3 minutes after setup:
#   1. a skewed Parquet dataset (file sizes, row group sizes and the share of lang='en' all vary),
#   2. a balanced plan for 2 ranks, made by the Spark job with --where "lang = 'en'",
#   3. the contrast: what plain Petastorm cur_shard/shard_count would give each rank (unequal steps),
#   4. torchrun DDP (gloo on CPU) for 2 epochs: equal steps on both ranks and the all_gather coverage check.
# Output goes to out/demo (gitignored). Exit status: 0 when every check passed.
# Environment: DEMO_OUT (default out/demo), DEMO_ROWS (60000), DEMO_SEED (10), DEMO_BATCH (64), DEMO_EPOCHS (2),
#   DEMO_SKIP_SETUP=1 to reuse an existing .venv without running scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [ "${DEMO_SKIP_SETUP:-0}" != 1 ]; then
  ./scripts/setup.sh
fi
. scripts/env.sh
# The package and examples run from this checkout even where setup's editable install is absent.
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONWARNINGS=ignore::FutureWarning,ignore::DeprecationWarning

out=${DEMO_OUT:-out/demo}
rows=${DEMO_ROWS:-60000}
seed=${DEMO_SEED:-10}  # with 60000 rows and 12 files, plain Petastorm gives rank 0 about 3x rank 1's 'en' rows
batch=${DEMO_BATCH:-64}
epochs=${DEMO_EPOCHS:-2}
world=2
rm -rf "$out"
mkdir -p "$out"
case "$out" in /*) ;; *) out="$root/$out" ;; esac  # absolute from here on (DEMO_OUT may be either)
dataset="$out/dataset"
plan="$out/plan"
started=$(date +%s)
step() { printf '\n== %s (%ss)\n' "$1" "$(( $(date +%s) - started ))"; }
fail() { echo "demo: $1" >&2; [ -n "${2:-}" ] && tail -n 40 "$2" >&2; exit 1; }

step "1/4 generate a skewed dataset: $rows rows, 12 files"
python -m petastorm_balanced.datagen "$dataset" --kind plain --rows "$rows" --files 12 --seed "$seed"

step "2/4 plan it with spark-submit (where lang = 'en', world size $world, batch size $batch)"
spark-submit --master 'local[2]' --conf spark.ui.enabled=false --conf spark.driver.host=127.0.0.1 \
  spark_jobs/plan_shards.py "$dataset" --world-size "$world" --batch-size "$batch" --where "lang = 'en'" \
  --output "$plan" > "$out/plan.log" 2>&1 || fail "the Spark planning job failed (log: $out/plan.log)" "$out/plan.log"
grep -v -E '^(WARN|INFO|[0-9]{2}/[0-9]{2}/[0-9]{2} )|^\s*$|NativeCodeLoader|log4j|Setting default log level|setLogLevel' \
  "$out/plan.log" | tail -n 15 || true
[ -f "$plan/plan.json" ] || fail "no plan written at $plan" "$out/plan.log"

step "3/4 the problem: plain Petastorm cur_shard/shard_count on the same rows"
python examples/petastorm_imbalance.py "$dataset" --world-size "$world" --batch-size "$batch" --lang en \
  --plan "$plan" | tee "$out/contrast.txt"

step "4/4 the fix: torchrun --nproc_per_node=$world examples/train_ddp.py ($epochs epochs, gloo)"
port=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
set +e
torchrun --nproc_per_node="$world" --master_addr 127.0.0.1 --master_port "$port" examples/train_ddp.py \
  --plan "$plan" --epochs "$epochs" --batch-size "$batch" --workers 2 --pg-timeout 120 > "$out/train.log" 2>&1
code=$?
set -e
grep -E '^\[rank [0-9]+\] (world|epoch)|^CHECK|^ALL CHECKS|^CHECKS FAILED' "$out/train.log" || true
[ "$code" = 0 ] || fail "training exited $code (log: $out/train.log)" "$out/train.log"

step "summary"
echo "plain Petastorm steps per rank: $(awk '$1 ~ /^[0-9]+$/ {printf "%s%s", sep, $3; sep=" "}' "$out/contrast.txt")"
echo "balanced steps per rank, per epoch:"
grep -E '^\[rank [0-9]+\] epoch' "$out/train.log" | sed -E 's/ mean loss.*//' | sort
grep -E '^ALL CHECKS PASSED' "$out/train.log"
echo "done in $(( $(date +%s) - started )) s; logs and data under $out"
