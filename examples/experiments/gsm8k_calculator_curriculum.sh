#!/bin/bash
# Issue 38 6(a) and issue 39 4(a), not run yet (about 5 hours here in fp32): GSM8K. SFT of the default model
# with and without the GSM8K paper's calculator annotations (same 80 steps, same data order), then GRPO seed 0
# from each (the annotated one with env=gsm8k_calculator), then GRPO with the curriculum from the plain SFT at the same
# generation budget (20 steps x 32 samples). Every model is evaluated greedily on the full 1,319-question test set
# (256 new tokens, as in training). Resumable: finished steps are skipped, interrupted runs resume from their
# last checkpoint. Stop between jobs with `touch /tmp/exp_stop5`; SIGTERM a running job to checkpoint it.
cd "$(dirname "$0")/../.." || exit 1  # the repository root
STOP=${STOP:-/tmp/exp_stop5}  # touch it to stop between runs
R=${RLVR:-.venv/bin/rlvr}  # RLVR: another rlvr (tests/test_docs.py records what the script runs)
D=runs/exp_s5
LOG=$D/log.txt
mkdir -p $D
stop() { [ -e $STOP ] && { echo "$(date -u +%T) stopped" >> $LOG; exit 0; }; }
job() {  # name, command...: skip when $D/name.done exists
  local name=$1; shift
  [ -e $D/$name.done ] && return
  stop
  echo "$(date -u +%T) $name start" >> $LOG
  "$@" > $D/$name.out 2>&1; local rc=$?
  echo "$(date -u +%T) $name rc=$rc" >> $LOG
  [ $rc = 0 ] && touch $D/$name.done || exit $rc
}
res() { [ -d $1/checkpoints ] && echo resume=true; }
SFT="--config configs/sft_gsm8k.yaml eval_every=0 save_every=10"
job sft_plain $R sft $SFT out=$D/sft_plain $(res $D/sft_plain)
job sft_calc $R sft $SFT env=gsm8k_calculator out=$D/sft_calc $(res $D/sft_calc)
EVAL="split=test max_new_tokens=256 batch_size=64"
job test_sft_plain $R eval model=$D/sft_plain/final $EVAL out=$D/test_sft_plain
job test_sft_calc $R eval model=$D/sft_calc/final env=gsm8k_calculator $EVAL out=$D/test_sft_calc
GRPO="--config configs/grpo_gsm8k.yaml seed=0 eval_every=10 save_every=5"
job grpo_plain $R train $GRPO model=$D/sft_plain/final out=$D/grpo_plain $(res $D/grpo_plain)
job grpo_calc $R train $GRPO model=$D/sft_calc/final env=gsm8k_calculator out=$D/grpo_calc $(res $D/grpo_calc)
job grpo_curriculum $R train $GRPO model=$D/sft_plain/final curriculum.enabled=true out=$D/grpo_curriculum \
  $(res $D/grpo_curriculum)
job test_grpo_plain $R eval model=$D/grpo_plain/final $EVAL out=$D/test_grpo_plain
job test_grpo_calc $R eval model=$D/grpo_calc/final env=gsm8k_calculator $EVAL out=$D/test_grpo_calc
job test_grpo_curriculum $R eval model=$D/grpo_curriculum/final $EVAL out=$D/test_grpo_curriculum
echo "$(date -u +%T) all done" >> $LOG
