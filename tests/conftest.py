"""Tiny models and tokenizers built in the tests themselves: nothing is downloaded, everything runs on CPU."""

import pytest
import torch

# Tiny models gain nothing from threads, and two busy threads on a 2-core machine slow everything down.
torch.set_num_threads(1)


def make_tokenizer():
    """A byte-level tokenizer with no merges: every byte is one token, so any text round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<pad>": 0, "<eos>": 1}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def make_model(vocab_size: int, seed: int = 0, layers: int = 2, hidden: int = 32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        pad_token_id=0, eos_token_id=1, bos_token_id=None, tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 0
    return model.eval()


def train_cfg(model_dir, out, **overrides):
    """A TrainConfig for the tiny model: 3 steps of 8 rollouts (2 questions x 4) of up to 12 tokens, fp32,
    validation on 2 questions every 2 steps; `overrides` (dotted section keys too) change any field."""
    from rlvr.config import TrainConfig, load_config

    base = dict(model=str(model_dir), dataset="arithmetic:steps=1,max=9", out=str(out), steps=3,
                rollout_batch_size=8, group_size=4, max_new_tokens=12, microbatch_size=3, learning_rate=1e-3,
                eval_every=2, eval_limit=2, eval_max_new_tokens=4, generation_dtype="float32", precision="fp32",
                tensorboard=False, log_rollouts_every=2)
    return load_config(TrainConfig, overrides={**base, **overrides})


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Each test its own $RLVR_CACHE (the `rlvr train` processes it starts too): a test that patches what
    validation computes must not read another test's cached step-0 validation, and tests leave nothing in the
    user's cache. The tests' models are built in the tests, so no converted model is missed."""
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "rlvr-cache"))


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture
def tiny_model(tokenizer):
    return make_model(len(tokenizer))


@pytest.fixture
def model_dir(tmp_path, tiny_model, tokenizer):
    """The tiny model and tokenizer saved where `model=...` can load them."""
    path = tmp_path / "tiny"
    tiny_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def crash_at(monkeypatch):
    """crash_at(step): the run is killed when it logs that step (after its last checkpoint); returns undo()."""
    from rlvr.core.tracking import MetricsLogger

    original = MetricsLogger.log

    def arm(step: int):
        def log(self, at, metrics):
            if at == step:
                raise KeyboardInterrupt(f"simulated kill at step {step}")
            return original(self, at, metrics)

        monkeypatch.setattr(MetricsLogger, "log", log)
        return lambda: monkeypatch.setattr(MetricsLogger, "log", original)

    return arm


@pytest.fixture
def default_grading():
    """Grading counts zeroed and the default grading configuration restored afterwards."""
    from rlvr.tasks.rewards import configure_grading, reset_grading_stats

    reset_grading_stats()
    yield
    configure_grading()
    reset_grading_stats()


def run_update(model, optimizer, tokens: dict, advantages, gradient_accumulation_steps: int, max_grad_norm,
               importance_reweighting_method: str = "none", old_log_probs=None, *, reference_log_probs=None,
               on_policy_ratio: bool = False, precision: str = "fp32", share_prefix: bool = True,
               temperature: float = 1.0, **choices):
    """`policy_gradient_update` on a tokenized batch with the estimator choices as keywords (the tests'
    shorthand for building the TrainBatch and the EstimatorSpec)."""
    from rlvr.algorithms.spec import EstimatorSpec
    from rlvr.algorithms.update import TrainBatch, policy_gradient_update

    batch = TrainBatch(tokens["input_ids"], tokens["labels"], tokens["response_mask"], advantages, old_log_probs,
                       reference_log_probs)
    spec = EstimatorSpec(importance_reweighting_method=importance_reweighting_method, **choices).validate()
    return policy_gradient_update(model, optimizer, batch, spec, gradient_accumulation_steps, max_grad_norm,
                                  on_policy_ratio=on_policy_ratio, precision=precision, share_prefix=share_prefix,
                                  temperature=temperature)
