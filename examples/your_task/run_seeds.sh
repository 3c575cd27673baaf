#!/usr/bin/env bash
# The measurement in examples/your_task/README.md: three seeds of config.yaml; each run resumes if interrupted.
# RLVR (default .venv/bin/rlvr) and OUT (default runs/your_task) may be set in the environment.
set -u
RLVR=${RLVR:-.venv/bin/rlvr}
OUT=${OUT:-runs/your_task}
for s in 0 1 2; do
  resume=""; [ -f "$OUT/s$s/config.yaml" ] && resume="resume=true"
  echo "$(date -u +%FT%TZ) seed $s start" >> "$OUT.log"
  "$RLVR" train --config examples/your_task/config.yaml seed=$s out=$OUT/s$s $resume; rc=$?
  echo "$(date -u +%FT%TZ) seed $s rc=$rc" >> "$OUT.log"
  [ $rc = 0 ] || exit $rc
done
