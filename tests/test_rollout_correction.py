"""The rollout correction (rollout_correction.*) in the learning stage: its importance weight pi_old / mu must
compare the sampler mu with pi_old, the policy before the rollout batch's first update, on every train batch
of the rollout batch -- also for estimators that have no ratio of their own (issue 56 item 3)."""

import pytest
import torch

from conftest import make_model, train_cfg
from rlvr.algorithms.policy import tokenize_prompt_and_output
from rlvr.algorithms.spec import PRESETS
from rlvr.algorithms.update import TrainBatch, score_log_probs
from rlvr.stages.learn import train_on_rollouts

OFF_POLICY = [name for name, spec in PRESETS.items() if spec.steps_per_rollout > 1]


class _NoSchedule:
    def step(self):
        pass


def _batch(tokenizer) -> TrainBatch:
    """2 groups of 4 rollouts of different lengths, every advantage nonzero (nothing pruned)."""
    prompts = ["1+2=", "7-3="] * 4
    responses = ["3", "44 ok", "so 3", "4", "x9", "four", "3 3 3", "it is 4"]
    tokens = tokenize_prompt_and_output(prompts, responses, tokenizer)
    advantages = torch.tensor([1.0, -0.5, 0.8, -1.2, 0.3, -0.9, 1.1, -0.4])
    return TrainBatch(tokens["input_ids"], tokens["labels"], tokens["response_mask"], advantages)


def _train(tokenizer, cfg, spec, sampler_is_pi_old: bool):
    """Train one rollout batch from the same start; the sampler's log-probs are pi_old's own (scored before any
    update) when `sampler_is_pi_old`, else unknown. Returns the parameters and the updates' metadata."""
    model = make_model(len(tokenizer), seed=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.0)
    batch = _batch(tokenizer)
    if sampler_is_pi_old:
        batch.rollout_log_probs = score_log_probs(model, batch.input_ids, batch.labels, batch.response_mask,
                                                  microbatch_size=8, share_prefix=False)
    updates = train_on_rollouts(model, optimizer, _NoSchedule(), None, batch, spec, cfg, step=1, times={})
    return {n: p.detach().clone() for n, p in model.named_parameters()}, updates


@pytest.mark.parametrize("algorithm", OFF_POLICY)
def test_a_sampler_identical_to_pi_old_changes_nothing(tmp_path, tokenizer, algorithm):
    """mu = pi_old exactly: every weight is 1 and every mismatch 0, so each correction mode trains exactly what
    no correction trains. Before the fix, estimators without a ratio (offpolicy_naive) compared mu with the
    live policy from the second train batch on, and their parameters moved by about 1e-2 more."""
    spec = PRESETS[algorithm]
    assert OFF_POLICY and "offpolicy_naive" in OFF_POLICY
    base, _ = _train(tokenizer, train_cfg(tmp_path, tmp_path / "a", algorithm=algorithm,
                                          **{"rollout_correction.mode": "none"}), spec, sampler_is_pi_old=False)
    start = make_model(len(tokenizer), seed=3).state_dict()
    assert max(float((base[n] - start[n]).abs().max()) for n in base) > 1e-2  # the updates do move the policy
    for mode in ("token_tis", "sequence_tis", "token_mask", "sequence_mask", "none"):
        cfg = train_cfg(tmp_path, tmp_path / mode, algorithm=algorithm, **{"rollout_correction.mode": mode})
        params, updates = _train(tokenizer, cfg, spec, sampler_is_pi_old=True)
        assert len(updates) == spec.steps_per_rollout
        for i, update in enumerate(updates):  # every train batch compares mu with pi_old, not the drifted policy
            # with mode none an estimator without a ratio has no pi_old after the first train batch, and
            # measures the mismatch on that one only
            measured = mode != "none" or spec.needs_old_log_probs or i == 0
            assert ("mismatch_kl" in update) == measured, (mode, i)
            if not measured:
                continue
            assert update["mismatch_kl"] == pytest.approx(0.0, abs=1e-9), mode
            assert update["mismatch_max_abs_log_ratio"] == pytest.approx(0.0, abs=1e-5), mode
            if mode != "none":
                assert update["is_weight_mean"] == pytest.approx(1.0, abs=1e-5), mode
        diff = max(float((params[n] - base[n]).abs().max()) for n in base)
        assert diff < 1e-5, (mode, diff)
