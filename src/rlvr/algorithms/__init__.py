"""The learning algorithms: pure maths first, then what applies it to a model.

    estimators  pure tensor functions of seed 004 (advantages, policy-gradient losses, KL, aggregation)
    spec        EstimatorSpec, the named presets (GRPO, Dr. GRPO, RFT, DAPO, GSPO, CISPO, ...) and the registry
                users extend with their own advantage or loss function
    policy      tokenising prompt + response, per-token log-probs and entropies, the SFT step
    packing     padding-free layouts: a microbatch's rows packed into a few sequences with a 4-D attention mask
    update      TrainBatch and the policy-gradient update over microbatches

May import: rlvr.core, rlvr.tasks (scoring a batch's rewards).
"""
