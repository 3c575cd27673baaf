"""Rollout engines: what turns prompts into sampled completions.

    base          the interface every engine implements (SamplingParams, Completion, RolloutEngine)
    sampling      counter-based random streams and inverse-CDF sampling, batch-independent per row
    hf            HFEngine: a transformers model with rlvr's own decode loop (CPU and GPU)
    weights       an engine's copy of the policy's weights (its architecture in the engine's dtype, LoRA merged)
    decode_llama  the fused CPU decode step for Llama-architecture models

A vLLM or llama.cpp backend would be one more module here implementing `base.RolloutEngine`.

May import: rlvr.core.
"""
