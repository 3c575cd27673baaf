#!/usr/bin/env bash
# The measurement of docs/agents.md ("Evidence that an agent learns"): the untrained model and three seeds of
# examples/agents/multiply.yaml, each evaluated greedily on the test split (100 rows no run trains or validates
# on) with the same agent, then examples/agents/summary.py. Resumable: finished jobs are skipped, an interrupted
# run resumes from its last checkpoint, an evaluation from its last finished block. RLVR (default .venv/bin/rlvr)
# and OUT (default runs/agents_multiply) may be set in the environment.
set -u
cd "$(dirname "$0")/../.." || exit 1  # the repository root
RLVR=${RLVR:-.venv/bin/rlvr}
OUT=${OUT:-runs/agents_multiply}
mkdir -p "$OUT"
EVAL="dataset=examples/agents/multiply.jsonl agent=examples/agents/multiply.py:run_episode agents.max_calls=3
      split=test max_new_tokens=48 temperature=0 batch_size=64 resume=true"
job() {  # name, command...: skipped when $OUT/name.done exists
  local name=$1; shift
  [ -e "$OUT/$name.done" ] && return 0
  echo "$(date -u +%FT%TZ) $name start" >> "$OUT/log.txt"
  "$@"; local rc=$?
  echo "$(date -u +%FT%TZ) $name rc=$rc" >> "$OUT/log.txt"
  [ $rc = 0 ] && touch "$OUT/$name.done" || exit $rc
}
job test_base "$RLVR" eval model=SmolLM2-135M-Instruct $EVAL out="$OUT/test_base"
for s in 0 1 2; do
  resume=""; [ -f "$OUT/s$s/config.yaml" ] && resume="resume=true"
  job train_s$s "$RLVR" train --config examples/agents/multiply.yaml seed=$s out="$OUT/s$s" $resume
  job test_s$s "$RLVR" eval model="$OUT/s$s/final" $EVAL out="$OUT/test_s$s"
done
echo "$(date -u +%FT%TZ) all done" >> "$OUT/log.txt"
