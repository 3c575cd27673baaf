"""Multi-turn environments (issue 38): the calculator, the episode loop on a real engine (tiny model), the ids
from sampler to learner, the loss by hand on a two-turn episode, every way an episode ends, and `rlvr train env=`
with a user's file, resumed exactly."""

import copy
import json
import math
import time
from pathlib import Path

import pytest
import torch

from conftest import train_cfg
from test_train import _parity  # noqa: F401 (autouse: a reward with spread in most groups)
from rlvr.algorithms.policy import get_response_log_probs, tokenize_prompt_and_ids
from rlvr.algorithms.spec import EstimatorSpec
from rlvr.algorithms.update import TrainBatch, policy_gradient_update
from rlvr.config import ConfigError
from rlvr.core.tracking import read_jsonl
from rlvr.engines.base import SamplingParams
from rlvr.engines.hf import HFEngine
from rlvr.environments import Environment, Observation, environment_factory
from rlvr.environments.calculator import CalculatorEnv, CalculatorError, evaluate, format_result
from rlvr.stages.episodes import episode_metrics, run_episodes
from rlvr.stages.rollouts import Rollouts, score_rollouts
from rlvr.tasks.records import Example
from rlvr.training import rl as train_module

ROOT = Path(__file__).resolve().parents[1]
OBS = " [obs 42]"
LETTERS = tuple("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


# ---------------------------------------------------------------------------------------------------
# The calculator


def test_the_calculator_computes_gsm8k_s_own_annotations():
    rows = (ROOT / "src/rlvr/data/gsm8k/train.jsonl").read_text().splitlines()
    pairs = [a.rsplit("=", 1) for r in rows for a in __import__("re").findall(r"<<([^>]*)>>", json.loads(r)["answer"])]
    agree = sum(abs(evaluate(e) - float(v)) <= 0.01 * max(1.0, abs(float(v))) for e, v in pairs)
    assert len(pairs) == agree == 23716  # every annotation of the 7,473 solutions, to GSM8K's own rounding
    assert (evaluate("48/2"), evaluate("2*20*.01"), evaluate("(3+4)**2"), evaluate("-5+2")) == (24, 0.4, 49, -3)
    assert [format_result(v) for v in (24.0, 0.4, 10 / 3, -3.0)] == ["24", "0.4", "3.3333", "-3"]


@pytest.mark.parametrize("expression", [
    "__import__('os').system('touch /tmp/pwned')", "open('/etc/passwd')", "x + 1", "9**9**9", "10**100", "1/0",
    "(1, 2)", "[1] * 10", "1e400", "2**-1**-1 ** 9999", "lambda: 1", "0 ** -1", "(-8) ** 0.5", "1" * 200, "",
])
def test_the_calculator_refuses_what_is_not_small_arithmetic(expression):
    with pytest.raises(CalculatorError):
        evaluate(expression)


def test_the_calculator_environment_answers_open_annotations_only():
    env = CalculatorEnv(Example("q", "1"))
    assert env.step("She sold <<48/2=", []) == Observation(text="24>>", tool_calls=1)
    assert env.step(" so 12 =", []) == Observation()  # prose: the model goes on
    assert env.step(" <<3*4>>12 and 5 =", []) == Observation()  # the annotation is closed
    assert env.step(" <<7/0=", []) == Observation(tool_calls=1, tool_errors=1)
    assert environment_factory("gsm8k_calculator") is CalculatorEnv


def test_env_names_and_files_are_checked_with_the_config(tmp_path, model_dir):
    with pytest.raises(ConfigError, match="did you mean 'gsm8k_calculator'"):
        train_cfg(model_dir, tmp_path / "r", env="gsm8k_calculater")
    with pytest.raises(ConfigError, match="no such file"):
        train_cfg(model_dir, tmp_path / "r", env="nowhere/env.py:Env")
    with pytest.raises(ConfigError, match="not a subclass"):
        train_cfg(model_dir, tmp_path / "r", env="rlvr.environments.calculator:evaluate")
    with pytest.raises(ConfigError, match="local loop only"):
        train_cfg(model_dir, tmp_path / "r", env="gsm8k_calculator", **{"distributed.rollout_workers": 1})


def test_env_options_set_an_environments_numbers_and_nothing_else(tmp_path, model_dir):
    from rlvr.environments.code_feedback import CodeFeedbackEnv

    env = environment_factory("code_feedback:max_turns=3, max_turn_tokens=160,attempt_discount=0.5")
    assert issubclass(env, CodeFeedbackEnv) and env is not CodeFeedbackEnv
    assert (env.max_turns, env.max_turn_tokens, env.attempt_discount, env.runs_programs) == (3, 160, 0.5, True)
    assert (CodeFeedbackEnv.max_turns, CodeFeedbackEnv.max_turn_tokens) == (2, None)  # the built-in is untouched
    assert environment_factory("code_feedback:max_total_tokens=none").max_total_tokens is None
    for bad, says in [("code_feedback:runs_programs=0", "runs_programs=0' is not key=value with a key of "
                       "CodeFeedbackEnv's: attempt_discount, max_total_tokens, max_turn_tokens, max_turns, "
                       "tool_timeout_s"),
                      ("code_feedback:max_turns=0", "max_turns='0': expected a positive whole number"),
                      ("code_feedback:max_turns=2.5", "expected a positive whole number"),
                      ("code_feedback:max_turns=none", "max_turns needs a number"),
                      ("code_feedback:tool_timeout_s=soon", "'soon' is not a number"),
                      ("code_feedbak:max_turns=3", "did you mean 'code_feedback'")]:
        with pytest.raises(ValueError) as err:
            environment_factory(bad)
        assert says in str(err.value), (bad, str(err.value))
    with pytest.raises(ConfigError, match="max_turn_tokens='-1'"):
        train_cfg(model_dir, tmp_path / "r", env="gsm8k_calculator:max_turn_tokens=-1")
    # a user's file takes options after its class
    (tmp_path / "my_env.py").write_text(USER_ENV)
    cfg = train_cfg(model_dir, tmp_path / "r", env=f"{tmp_path / 'my_env.py'}:Letters:max_turns=5")
    assert environment_factory(cfg.env).max_turns == 5 and environment_factory(cfg.env).__name__ == "Letters"


# ---------------------------------------------------------------------------------------------------
# Episodes on the real engine


class Echo(Environment):
    """Every turn that ends at a letter gets OBS back, for up to 3 turns."""

    stop = LETTERS
    max_turns = 3

    def step(self, text, ids):
        return Observation(text=OBS, tool_calls=1, reward=float(len(ids)))


def _episodes(tiny_model, tokenizer, env=Echo, n=4, max_new_tokens=40, seed=3):
    questions = [Example("2+2", "4"), Example("3+4", "7")]
    prompts = ["Q: 2+2?\nA:", "Q: 3+4?\nA:"]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, n=n, seed=seed, logprobs=True,
                              entropy=True, stop=("Z!",))
    engine = HFEngine(tiny_model, tokenizer, dtype="float32")
    return questions, prompts, run_episodes(engine, env, questions, prompts, sampling, tokenizer)


def test_the_learner_trains_the_ids_the_sampler_produced_and_scores_them_as_it_did(tiny_model, tokenizer):
    questions, prompts, episodes = _episodes(tiny_model, tokenizer)
    obs_ids = tokenizer(OBS, add_special_tokens=False).input_ids
    multi = [c for c in episodes if c.episode["turns"] >= 2]
    assert len(multi) >= 4 and all(c.episode["observation_tokens"] == len(obs_ids) * (c.episode["turns"] - 1)
                                   for c in multi if c.episode["end"] != "max_tokens")
    for c in episodes:  # observations sit between the turns as ids, masked, with no sampling log-prob
        assert len(c.token_ids) == len(c.loss_mask) == len(c.logprobs)
        assert [math.isnan(x) for x in c.logprobs] == [not m for m in c.loss_mask]
        assert OBS in c.text or c.episode["turns"] == 1

    def reward(response, truth):
        return {"reward": float(len(response) % 2), "format_reward": 1.0, "answer_reward": 0.0}

    rollouts = Rollouts(questions, prompts, episodes)
    cfg = train_cfg("unused", "unused", group_size=4, rollout_batch_size=8)
    scored = score_rollouts(rollouts, reward, cfg.estimator, cfg, tokenizer)
    batch = scored.batch
    assert scored.unknown_rows == 0
    prompt_lengths = [len(tokenizer(p, add_special_tokens=False).input_ids) for p in prompts]
    for row, c in enumerate(episodes):
        start = prompt_lengths[c.prompt_index] - 1  # labels are the ids shifted by one
        span = slice(start, start + len(c.token_ids))
        assert batch.labels[row, span].tolist() == c.token_ids  # no id decoded and encoded again
        assert batch.response_mask[row, span].tolist() == c.loss_mask
        assert int(batch.response_mask[row].sum()) == sum(c.loss_mask)
    # the learner's log-probs of the sampled ids, in the context the learner sees, are the sampler's: it saw the
    # same ids before every turn (observations included)
    with torch.no_grad():
        learner = get_response_log_probs(tiny_model, batch.input_ids, batch.labels)["log_probs"]
    sampled = batch.response_mask
    torch.testing.assert_close(learner[sampled], batch.rollout_log_probs[sampled], atol=2e-5, rtol=0)
    assert not batch.rollout_log_probs[sampled].isnan().any()
    metrics = episode_metrics(episodes)
    assert metrics["env/turns"] == sum(c.episode["turns"] for c in episodes) / 8
    assert metrics["env/reward_turn_1"] == pytest.approx(
        sum(c.episode["turn_rewards"][0] for c in episodes if c.episode["turn_rewards"]) /
        sum(1 for c in episodes if c.episode["turn_rewards"]))
    assert metrics["env/first_turn_reward"] == pytest.approx(
        sum(c.episode["turn_rewards"][0] for c in episodes if c.episode["turn_rewards"]) / 8)


def test_a_one_turn_episode_is_the_single_turn_completion(tiny_model, tokenizer):
    # an environment that never answers: turn 1 is the same engine call, so the same samples, as without one
    class Never(Environment):
        stop = ()

    _, prompts, episodes = _episodes(tiny_model, tokenizer, env=Never)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=40, n=4, seed=3, logprobs=True, entropy=True,
                              stop=("Z!",))
    plain = HFEngine(tiny_model, tokenizer, dtype="float32").generate(prompts, sampling)
    assert [c.token_ids for c in episodes] == [c.token_ids for c in plain]
    assert [c.text for c in episodes] == [c.text for c in plain]
    assert [c.finish_reason for c in episodes] == [c.finish_reason for c in plain]
    assert all(c.episode["end"] == ("answer" if c.finish_reason == "stop" else "max_tokens") for c in episodes)
    assert all(c.loss_mask == [True] * len(c.token_ids) and c.episode["turns"] == 1 for c in episodes)


def test_observation_ids_are_out_of_the_loss_and_every_normaliser(tiny_model, tokenizer):
    # a two-turn episode: 3 sampled ids, 2 observation ids, 2 sampled ids; GRPO's per-sequence normalisation with
    # a KL penalty and an entropy bonus; the update equals the hand-written loss over the 5 sampled ids only
    prompt, ids = "Q: 2+2?\nA:", [70, 71, 72, 90, 91, 73, 74]
    mask = [True, True, True, False, False, True, True]
    tokens = tokenize_prompt_and_ids([prompt], [ids], tokenizer, [mask])
    reference = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
        ref = get_response_log_probs(reference, tokens["input_ids"], tokens["labels"])["log_probs"]
    advantage, beta, coef = 1.5, 0.1, 0.05
    batch = TrainBatch(tokens["input_ids"], tokens["labels"], tokens["response_mask"], torch.tensor([advantage]),
                       reference_log_probs=ref)
    spec = EstimatorSpec(loss_normalization="sequence", beta=beta, entropy_coef=coef).validate()
    models = [copy.deepcopy(tiny_model), copy.deepcopy(tiny_model)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=1.0) for m in models]
    loss, _ = policy_gradient_update(models[0], optimizers[0], batch, spec, 1, None, on_policy_ratio=True)

    logits = models[1](input_ids=tokens["input_ids"]).logits.float()
    logp = torch.log_softmax(logits, -1).gather(-1, tokens["labels"].unsqueeze(-1)).squeeze(-1)
    entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    kl = 0.5 * (logp - ref) ** 2  # k2, the default estimator
    trained = tokens["response_mask"][0]
    assert trained.sum() == 5 and trained.tolist().count(True) == 5

    def by_hand(positions):
        per_token = -advantage * logp[0] + beta * kl[0] - coef * entropy[0]
        return per_token[positions].sum() / positions.sum()

    hand = by_hand(trained)
    everything = tokens["response_mask"][0].clone()
    everything[everything.nonzero().min() : everything.nonzero().max() + 1] = True  # observations too
    assert abs(float(by_hand(everything).detach() - hand.detach())) > 1e-3  # the test can tell the two apart
    assert float(loss) == pytest.approx(float(hand.detach()), rel=1e-5)
    hand.backward()
    optimizers[1].step()
    for (name, p), q in zip(models[0].named_parameters(), models[1].parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=1e-6, msg=name)


class Talkative(Environment):
    stop = LETTERS
    max_turns = 50

    def step(self, text, ids):
        return Observation(ids=[5] * 7)


class Raises(Environment):
    stop = LETTERS

    def step(self, text, ids):
        raise RuntimeError("the tool fell over")


class Slow(Environment):
    stop = LETTERS
    tool_timeout_s = 0.2

    def step(self, text, ids):
        time.sleep(1.5)
        return Observation(text="late")


class Done(Environment):
    stop = LETTERS

    def step(self, text, ids):
        return Observation(done=True, reward=1.0)


def test_every_way_an_episode_ends(tiny_model, tokenizer):
    _, _, echo = _episodes(tiny_model, tokenizer, env=Echo, max_new_tokens=200)
    ends = {c.episode["end"] for c in echo}
    assert "max_turns" in ends and ends <= {"max_turns", "answer"}
    assert all(c.episode["turns"] == 3 and c.finish_reason == "length" for c in echo if c.episode["end"] == "max_turns")

    _, _, talk = _episodes(tiny_model, tokenizer, env=Talkative, max_new_tokens=40)
    long = [c for c in talk if c.episode["end"] == "max_tokens"]
    assert len(long) >= 4 and all(len(c.token_ids) == 40 and c.finish_reason == "length" for c in long)

    _, _, raised = _episodes(tiny_model, tokenizer, env=Raises)
    called = [c for c in raised if c.episode["end"] != "answer"]
    assert called and all(c.episode["end"] == "tool_error" and "the tool fell over" in c.episode["error"]
                          and c.episode["tool_errors"] == 1 for c in called)

    start = time.monotonic()
    _, _, slow = _episodes(tiny_model, tokenizer, env=Slow)
    waited = time.monotonic() - start
    timed_out = [c for c in slow if c.episode["end"] == "tool_timeout"]
    assert timed_out and all("late" not in c.text for c in timed_out)
    assert episode_metrics(slow)["env/tool_timeouts"] == len(timed_out)
    assert waited < 1.5 * 3  # the steps waited side by side, not one timeout after another
    # the rounds' wall time is shared out among the episodes stepped in them: its sum is the time spent stepping
    assert 0.2 <= episode_metrics(slow)["time/env_tools"] <= waited  # one round, which waited its timeout

    _, _, done = _episodes(tiny_model, tokenizer, env=Done)
    assert {c.episode["end"] for c in done} <= {"done", "answer"} and any(c.episode["end"] == "done" for c in done)
    assert all(c.episode["turns"] == 1 for c in done)


def _turn_lengths(c) -> list[int]:
    """The lengths of an episode's model turns: the runs of ids its loss mask trains."""
    runs, previous = [], False
    for trained in c.loss_mask:
        if trained and previous:
            runs[-1] += 1
        elif trained:
            runs.append(1)
        previous = trained
    return runs


def test_a_turn_cap_limits_each_model_turn_and_leaves_the_rest_alone(tiny_model, tokenizer):
    cap = 6
    capped = type("EchoCapped", (Echo,), {"max_turn_tokens": cap})
    _, _, free = _episodes(tiny_model, tokenizer, env=Echo, max_new_tokens=60)
    _, _, short = _episodes(tiny_model, tokenizer, env=capped, max_new_tokens=60)
    assert max(max(_turn_lengths(c)) for c in free) > cap  # without the cap some turn runs longer
    for f, c in zip(free, short):
        lengths = _turn_lengths(c)
        assert max(lengths) <= cap and len(lengths) == c.episode["turns"]
        if lengths[-1] == cap and c.episode["end"] != "max_turns":  # a turn cut short is not an answer
            assert c.episode["end"] == "max_tokens" and c.finish_reason == "length"
        first = _turn_lengths(f)[0]
        if first <= cap:  # the same first turn: the cap changes nothing the turn did not reach
            assert list(c.token_ids[:first]) == list(f.token_ids[:first])
    # turns under the cap go on: some episode has a second turn, and every episode's budget is still the run's
    assert any(c.episode["turns"] >= 2 for c in short) and any(c.episode["end"] == "max_tokens" for c in short)
    assert all(len(c.token_ids) <= 60 for c in short)


# ---------------------------------------------------------------------------------------------------
# rlvr train env=...


USER_ENV = '''
from rlvr.environments import Environment, Observation


class Hint(Environment):
    """A user's environment: a turn that ends at a space gets " ok" back, twice at most."""

    stop = (" ",)
    max_turns = 3

    def step(self, text, ids):
        return Observation(text=" ok", tool_calls=1)


class Letters(Hint):
    stop = tuple("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
'''


def _env_cfg(model_dir, out, env, **kw):
    return train_cfg(model_dir, out, env=env, steps=4, max_new_tokens=16, save_every=2, **kw)


def test_a_users_environment_file_trains_and_resumes_exactly(tmp_path, model_dir, crash_at):
    (tmp_path / "my_env.py").write_text(USER_ENV)
    env = f"{tmp_path / 'my_env.py'}:Hint"
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    train_module.train_grpo(_env_cfg(model_dir, straight, env))
    rows = [r for r in read_jsonl(straight / "metrics.jsonl") if "train/loss" in r]
    assert len(rows) == 4 and all(r["env/turns"] >= 1 for r in rows) and any(r["env/turns"] > 1 for r in rows)
    assert any(r["env/observation_tokens"] > 0 for r in rows)
    logged = [json.loads(line) for line in (straight / "rollouts.jsonl").read_text().splitlines()]
    assert any(" ok" in r["response"] for r in logged)
    undo = crash_at(3)
    with pytest.raises(KeyboardInterrupt):
        train_module.train_grpo(_env_cfg(model_dir, killed, env))
    undo()
    train_module.train_grpo(_env_cfg(model_dir, killed, env, resume=True))
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time") and k != "val/seconds"}  # noqa: E731
                          for r in rows]
    assert strip(read_jsonl(killed / "metrics.jsonl")) == strip(read_jsonl(straight / "metrics.jsonl"))


@pytest.mark.parametrize("algorithm", ["grpo", "dapo", "offpolicy_gspo"])
def test_environments_train_with_the_estimators_lora_and_microbatches(tmp_path, model_dir, algorithm):
    (tmp_path / "my_env.py").write_text(USER_ENV)
    extra = {"lora_rank": 4} if algorithm == "grpo" else {}
    # (dapo masks truncated episodes: 28 tokens leave the tiny model room to end some, on the questions drawn)
    budget = 28 if algorithm == "dapo" else 16
    train_module.train_grpo(train_cfg(model_dir, tmp_path / "run", env=f"{tmp_path / 'my_env.py'}:Hint",
                                      algorithm=algorithm, steps=2, max_new_tokens=budget, microbatch_size=2, **extra))
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "train/loss" in r]
    # (dapo masks truncated episodes, those that ran out of turns or tokens, so a step may train nothing)
    assert len(rows) >= (1 if algorithm == "dapo" else 2)
    assert all(math.isfinite(r["train/loss"]) and r["train/trained_tokens"] > 0 for r in rows)
    steps = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "env/turns" in r]
    assert len(steps) == 2 and any(r["env/observation_tokens"] > 0 for r in steps)


def test_the_example_environment_runs_through_env_file_class(tmp_path, model_dir):
    # examples/retry_env.py: a user's file; its own reward (the last attempt's r1_zero score) replaces the run's
    env = f"{ROOT / 'examples' / 'retry_env.py'}:RetryEnv"
    summary = train_module.train_grpo(train_cfg(model_dir, tmp_path / "run", env=env, steps=2))
    assert summary["steps"] == 2
    rows = list(read_jsonl(tmp_path / "run" / "metrics.jsonl"))
    trained = [r for r in rows if "train/reward" in r]
    assert len(trained) == 2 and all(r["train/reward"] == 0 and r["env/turns"] >= 1 for r in trained)
    assert any("val/accuracy" in r for r in rows)  # validation runs the episodes too


# ---------------------------------------------------------------------------------------------------
# rlvr sft env=gsm8k_calculator


def test_sft_for_the_calculator_keeps_the_annotations_and_trains_only_the_models_pieces(tokenizer):
    from rlvr.tasks.prompts import get_prompt
    from rlvr.training.sft import tokenize_prompt_and_segments

    example = Example("q", "72", "48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=72>>72.")
    response = get_prompt("r1_zero").sft_response(example, annotations=True)
    assert response == " 48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=72>>72. </think> <answer> 72 </answer>"
    segments = CalculatorEnv(example).sft_segments(response)
    assert [t for t, trained in segments if not trained] == ["24>>", "72>>"]  # what the calculator writes
    assert "".join(t for t, _ in segments) == response
    tokens = tokenize_prompt_and_segments(["Q:"], [segments], tokenizer)
    labels, mask = tokens["labels"][0], tokens["response_mask"][0]
    assert tokenizer.decode(labels[mask.nonzero().min():]) == response  # byte-level: every piece as written
    untrained = tokenizer.decode(labels[~mask][1:])  # (the first label is the prompt's second byte)
    assert untrained == "24>>72>>" and int(mask.sum()) == len(response) - len("24>>72>>")


def test_rlvr_sft_with_the_calculator_runs_and_validates_through_it(tmp_path, model_dir):
    from rlvr.config import SFTConfig, load_config
    from rlvr.training import sft as sft_module

    cfg = load_config(SFTConfig, overrides=dict(
        model=str(model_dir), dataset="gsm8k", env="gsm8k_calculator", out=str(tmp_path / "sft"), steps=2,
        batch_size=2, microbatch_size=2, train_limit=4, eval_every=2, eval_limit=2, eval_max_new_tokens=8,
        generation_dtype="float32", precision="fp32", tensorboard=False))
    sft_module.train_sft(cfg)
    rows = list(read_jsonl(tmp_path / "sft" / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [0, 1, 2] and "val/accuracy" in rows[-1]
    assert all(math.isfinite(r["train/loss"]) for r in rows[1:])


# ---------------------------------------------------------------------------------------------------
# python_tool: blocks run in the sandbox


def test_python_tool_runs_the_block_in_the_sandbox_and_returns_what_it_printed(tmp_path, model_dir):
    from rlvr import sandbox
    from rlvr.environments.python_tool import PythonToolEnv

    sandbox.configure("bwrap")
    env = PythonToolEnv(Example("q", "72"))
    assert env.step("First:\n```python\nprint(48 / 2 + 48)\nprint('ok')\n```\n", []) == Observation(
        text="```output\n72.0\nok\n```\n", tool_calls=1)
    assert env.step("```python\nx = [1]\nx[3]\n```\n", []).text == "```output\nIndexError: list index out of range\n```\n"
    secret = tmp_path / "secret.txt"
    secret.write_text("the hidden tests")
    seen = env.step(f"```python\nprint(open({str(secret)!r}).read())\n```\n", [])
    assert "FileNotFoundError" in seen.text and "hidden" not in seen.text  # the host's files are not there
    slow = env.step("```python\nwhile True: pass\n```\n", [])
    assert slow.text.startswith("```output\n(timeout") and slow.tool_errors == 1
    assert env.step("no block here\n```\n", []) == Observation()
    # a run with it checks the sandbox first (as code datasets do)
    assert train_cfg(model_dir, tmp_path / "r", env="python_tool").grades_code
    assert not train_cfg(model_dir, tmp_path / "r", env="gsm8k_calculator").grades_code


def test_code_feedback_shows_the_first_failing_test_and_accepts_a_fixed_program():
    from rlvr import sandbox
    from rlvr.environments.code_feedback import AGAIN, CodeFeedbackEnv
    from rlvr.tasks.code import code_task

    sandbox.configure("bwrap")
    example = next(e for e in code_task("train", 20) if e.answer.startswith('{"entry_point": "no_negatives"'))
    env = CodeFeedbackEnv(example)
    wrong = "```python\ndef no_negatives(values):\n    return values\n```\n"
    told = env.step(wrong, [])
    assert told.text == ("\nA test failed: no_negatives([7, 11, -1]) gave [7, 11, -1], expected [7, 11, 0].\n"
                         + AGAIN) and told.reward == 0.0 and not told.done
    raises = env.step("```python\ndef no_negatives(values):\n    return values[5]\n```\n", [])
    assert "raised IndexError" in raises.text
    broken = env.step("```python\ndef no_negatives(values) return\n```\n", [])
    assert "did not run to the end" in broken.text
    assert "No complete" in env.step("I would write it.\n```\n", []).text
    right = f"```python\n{example.solution.rstrip()}\n```\n"
    assert env.step(right, []) == Observation(done=True, reward=1.0, tool_calls=1)
    # with a discount, a pass on the second attempt is worth discount^1; the transcript's last block is graded
    env.attempt_discount = 0.5
    assert env.reward(wrong + told.text + right) == 0.5
    assert env.reward(right) == 1.0 and env.reward(right + told.text + wrong) == 0.0


def test_a_code_run_with_feedback_starts_checks_its_sandbox_and_logs_episodes(tmp_path, model_dir):
    cfg = train_cfg(model_dir, tmp_path / "run", dataset="code:level=1", prompt="code", env="code_feedback",
                    steps=1, max_new_tokens=16)
    assert cfg.grades_code
    train_module.train_grpo(cfg)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    trained = [r for r in rows if "env/turns" in r]
    assert len(trained) == 1 and trained[0]["env/turns"] >= 1
    # validation ran the episodes too: the first attempts' pass rate beside the last's (val/accuracy)
    validated = [r for r in rows if "val/accuracy" in r]
    assert validated and all(0 <= r["val/env/first_turn_reward"] <= 1 and r["val/env/turns"] >= 1 for r in validated)


def test_rlvr_eval_runs_episodes_and_dpo_refuses_an_environment(tmp_path, model_dir):
    from rlvr.config import DPOConfig, EvalConfig, load_config
    from rlvr.stages.evaluation import run_eval

    (tmp_path / "my_env.py").write_text(USER_ENV)
    cfg = load_config(EvalConfig, overrides=dict(model=str(model_dir), dataset="arithmetic", limit=2, samples=2,
                                                 max_new_tokens=12, env=f"{tmp_path / 'my_env.py'}:Letters",
                                                 out=str(tmp_path / "eval")))
    run_eval(cfg)
    records = [json.loads(line) for line in (tmp_path / "eval" / "results.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(r["turns"] >= 1 and "end" in r and "turn_rewards" in r for r in records)
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["env"]["env/turns"] == sum(r["turns"] for r in records) / 4
    assert any(" ok" in r["response"] for r in records)
    with pytest.raises(ConfigError, match="single-turn"):
        load_config(DPOConfig, overrides=dict(model=str(model_dir), env="gsm8k_calculator"))


def test_the_curriculum_s_first_pass_samples_episodes_too(tmp_path, model_dir, monkeypatch):
    from rlvr import stages
    from rlvr.stages import episodes

    (tmp_path / "my_env.py").write_text(USER_ENV)
    during, calls = [False], []
    real_episodes, real_first_pass = episodes.run_episodes, stages.first_pass

    def spy(*args, **kwargs):
        calls.append((during[0], len(args[3])))
        return real_episodes(*args, **kwargs)

    def first_pass(*args, **kwargs):
        during[0] = True
        try:
            return real_first_pass(*args, **kwargs)
        finally:
            during[0] = False

    monkeypatch.setattr(episodes, "run_episodes", spy)
    monkeypatch.setattr(stages, "first_pass", first_pass)
    train_module.train_grpo(train_cfg(model_dir, tmp_path / "run", env=f"{tmp_path / 'my_env.py'}:Hint", steps=1,
                                      **{"curriculum.enabled": True, "curriculum.first_pass": 4}))
    first = next(r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "time/curriculum_first_pass" in r)
    assert first["curriculum/seen"] == 4
    # the first pass: 4 questions, 2 a batch (8 rollouts of group 4), each batch as episodes
    assert [n for inside, n in calls if inside] == [2, 2]


def test_an_environment_s_reward_replaces_the_reward_function_s():
    from rlvr.engines.base import Completion
    from rlvr.stages.episodes import apply_env_rewards

    def episode(reward):
        return Completion(0, 0, "t", [1], "stop", episode={"reward": reward})

    scores = [{"reward": 0.2, "format_reward": 1.0, "answer_reward": 0.0} for _ in range(4)]
    completions = [episode(None), episode(0.7), episode({"reward": 0.5, "format_reward": 0.0, "answer_reward": 1.0}),
                   Completion(0, 1, "t", [1], "stop")]
    assert apply_env_rewards(scores, completions) == [
        {"reward": 0.2, "format_reward": 1.0, "answer_reward": 0.0},  # None: the reward function's score
        {"reward": 0.7, "format_reward": 1.0, "answer_reward": 0.0},  # a number: the reward only
        {"reward": 0.5, "format_reward": 0.0, "answer_reward": 1.0},  # a dict: the whole score
        {"reward": 0.2, "format_reward": 1.0, "answer_reward": 0.0}]  # a single-turn completion: untouched


# ---------------------------------------------------------------------------------------------------
# Continuing an episode from the engine's KV cache


@pytest.mark.parametrize("fast_decode", [True, False])
def test_continuing_from_kept_kv_samples_what_prefilling_the_history_samples(tiny_model, tokenizer, fast_decode):
    # turn 1 with G=4 (the shared-prefix decoder) keeps each row's KV; turn 2's prompts continue them, plus one
    # prompt with nothing kept, in the same call: the same ids and log-probs as an engine that prefills everything
    kept = HFEngine(tiny_model, tokenizer, dtype="float32", fast_decode=fast_decode)
    plain = HFEngine(tiny_model, tokenizer, dtype="float32", fast_decode=fast_decode, prefix_cache_mib=0)
    first = SamplingParams(temperature=1.0, max_new_tokens=30, n=4, seed=5, stop=LETTERS, logprobs=True,
                           keep_cache=True)
    prompts = ["Q: 2+2?\nA:", "Q: 13+4?\nA:"]
    turn1 = kept.generate(prompts, first)
    assert [c.token_ids for c in turn1] == [c.token_ids for c in plain.generate(prompts, first)]
    continued = [c for c in turn1 if c.finish_reason == "stop" and c.token_ids[-1] != 1]
    assert len(kept.prefix_cache) == len(continued) >= 4
    obs = tokenizer(OBS, add_special_tokens=False).input_ids
    history = [tokenizer(prompts[c.prompt_index], add_special_tokens=False).input_ids + c.token_ids + obs
               for c in continued] + [tokenizer("Q: 9+9?\nA:", add_special_tokens=False).input_ids]
    second = SamplingParams(temperature=1.0, max_new_tokens=20, seed=6, logprobs=True, entropy=True)
    before = dict(kept.stats)
    a, b = kept.generate(history, second), plain.generate(history, second)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    for x, y in zip(a, b):
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(x.entropies), torch.tensor(y.entropies), atol=1e-5, rtol=0)
    # every continued row fed only its last sampled id and the observation; the kept KV is used once
    fed = kept.stats["prefill_tokens"] - before["prefill_tokens"]
    reused = kept.stats["cached_tokens"] - before["cached_tokens"]
    assert reused == sum(len(h) for h in history) - fed
    widest = max(len(obs) + 1, len(history[-1]))  # the columns fed: the new prompt's, or an observation and one id
    assert fed == sum(min(len(h), widest) for h in history)
    assert len(kept.prefix_cache) == 0


def test_kept_kv_is_dropped_when_the_weights_change_and_beyond_its_memory(tiny_model, tokenizer):
    from rlvr.engines.kv_cache import PrefixCache

    engine = HFEngine(tiny_model, tokenizer, dtype="float32")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=30, n=4, seed=5, stop=LETTERS, keep_cache=True)
    engine.generate(["Q: 2+2?\nA:"], sampling)
    assert len(engine.prefix_cache) > 0
    engine.sync_weights(tiny_model)  # the engine shares the policy: its weights may have changed in place
    assert len(engine.prefix_cache) == 0
    # the cache by hand: the longest kept prefix wins, at most all but the prompt's last id, oldest dropped first
    cache = PrefixCache(max_bytes=3 * 4 * 8)
    one, two = torch.zeros(1, 2, 1, 2, 2), torch.ones(1, 2, 1, 4, 2)  # 8 and 16 floats
    cache.put([1, 2], one)
    cache.put([1, 2, 3, 4], two)
    assert cache.lookup([1, 2, 3, 4, 5])[:1] == (4,) and cache.lookup([1, 2, 3, 4])[0] == 3
    assert cache.lookup([1, 2, 9])[0] == 2 and cache.lookup([7, 1, 2])[1] is None
    cache.put([5, 6, 7, 8], two)  # 40 floats > 24: the two oldest go
    assert list(cache.entries) == [(5, 6, 7, 8)] and cache.bytes == 64


def test_episodes_with_and_without_kept_kv_are_the_same_episodes(tiny_model, tokenizer):
    questions = [Example("2+2", "4"), Example("3+4", "7")]
    prompts = ["Q: 2+2?\nA:", "Q: 3+4?\nA:"]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=40, n=4, seed=3, logprobs=True, stop=("Z!",))
    out = {}
    for mib in (1024, 0):
        engine = HFEngine(tiny_model, tokenizer, dtype="float32", prefix_cache_mib=mib)
        out[mib] = run_episodes(engine, Echo, questions, prompts, sampling, tokenizer), engine
    (kept, engine), (plain, _) = out[1024], out[0]
    assert sum(c.episode["turns"] >= 2 for c in kept) >= 4
    assert [c.token_ids for c in kept] == [c.token_ids for c in plain]
    assert [c.loss_mask for c in kept] == [c.loss_mask for c in plain]
    assert [c.text for c in kept] == [c.text for c in plain]
    a = torch.tensor([x for c in kept for x in c.logprobs])
    b = torch.tensor([x for c in plain for x in c.logprobs])
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0, equal_nan=True)
    assert engine.stats["cached_tokens"] > engine.stats["prefill_tokens"] / 2
    assert len(engine.prefix_cache) == 0  # nothing kept once the episodes are over


# ---------------------------------------------------------------------------------------------------
# The last allowed turn is stepped too (issue 56)


class NumberGame(Environment):
    """Guess the row's number in 1..63: each `<guess>k</guess>` is told higher or lower, the right one wins. A
    binary search needs 6 guesses for 1, 17 or 63, one for 32."""

    stop = ("</guess>",)
    max_turns = 6

    def __init__(self, example):
        super().__init__(example)
        self.secret, self.guesses, self.won = int(example.answer), [], False

    def step(self, text, ids):
        guess = int(text.rsplit("<guess>", 1)[1].removesuffix("</guess>"))
        self.guesses.append(guess)
        self.won = guess == self.secret
        if self.won:
            return Observation(done=True, reward=1.0, tool_calls=1)
        return Observation(text=" higher" if guess < self.secret else " lower", reward=0.0, tool_calls=1)

    def reward(self, transcript):
        return float(self.won)


class Bisector:
    """A rollout engine that plays NumberGame by binary search: it reads the history's hints and guesses the
    middle of what is left."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, sampling, progress=None, keys=None):
        import re

        from rlvr.engines.base import Completion

        out = []
        for i, prompt in enumerate(prompts):
            history = prompt if isinstance(prompt, str) else self.tokenizer.decode(prompt)
            low, high = 1, 63
            for guess, hint in re.findall(r"<guess>(\d+)</guess> (higher|lower)", history):
                low, high = (int(guess) + 1, high) if hint == "higher" else (low, int(guess) - 1)
            text = f" <guess>{(low + high) // 2}</guess>"
            ids = self.tokenizer(text, add_special_tokens=False).input_ids
            out += [Completion(i, j, text, ids, "stop") for j in range(sampling.n)]
        return out


def _games(tokenizer, env, secrets):
    questions = [Example(f"number {s}", s) for s in secrets]
    prompts = ["Guess my number in 1..63." for _ in secrets]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=400, n=1, stop=("</answer>",))
    return run_episodes(Bisector(tokenizer), env, questions, prompts, sampling, tokenizer)


def test_a_game_won_on_its_last_allowed_turn_is_won(tokenizer):
    games = _games(tokenizer, NumberGame, ["32", "1", "63", "17"])
    assert [c.episode["turns"] for c in games] == [1, 6, 6, 6]
    assert [c.episode["end"] for c in games] == ["done"] * 4
    assert [c.episode["reward"] for c in games] == [1.0] * 4 and {c.finish_reason for c in games} == {"stop"}
    assert games[1].episode["turn_rewards"] == [0.0] * 5 + [1.0] and games[1].episode["tool_calls"] == 6
    assert games[1].text == (" <guess>32</guess> lower <guess>16</guess> lower <guess>8</guess> lower"
                             " <guess>4</guess> lower <guess>2</guess> lower <guess>1</guess>")

    # one turn fewer: the fifth guess is still stepped (the game's state has it), its hint is dropped, and the
    # game is lost at max_turns
    (lost,) = _games(tokenizer, type("FiveGuesses", (NumberGame,), {"max_turns": 5}), ["1"])
    assert (lost.episode["end"], lost.episode["reward"], lost.finish_reason) == ("max_turns", 0.0, "length")
    assert lost.episode["tool_calls"] == 5 and lost.episode["turn_rewards"] == [0.0] * 5
    assert lost.text.endswith("<guess>2</guess>") and lost.loss_mask[-1]
    hint = len(tokenizer(" lower", add_special_tokens=False).input_ids)
    assert lost.episode["observation_tokens"] == 4 * hint == sum(not m for m in lost.loss_mask)


# ---------------------------------------------------------------------------------------------------
# Episodes' budgets, options and code_feedback's tests (issue 56 item 6)


class Scripted:
    """A rollout engine whose every turn is `text`, one byte-level id per character, ending as `finish`."""

    def __init__(self, tokenizer, text, finish="stop"):
        self.tokenizer, self.text, self.finish = tokenizer, text, finish

    def generate(self, prompts, sampling, progress=None, keys=None):
        from rlvr.engines.base import Completion

        ids = self.tokenizer(self.text, add_special_tokens=False).input_ids
        assert len(ids) <= sampling.max_new_tokens
        return [Completion(i, j, self.text, ids, self.finish) for i in range(len(prompts)) for j in range(sampling.n)]


class Guess(Environment):
    stop = ("</guess>",)

    def __init__(self, example):
        super().__init__(example)
        self.steps = 0

    def step(self, text, ids):
        self.steps += 1
        return Observation(text=" again", tool_calls=1)

    def reward(self, transcript):
        return float(self.steps)


def test_an_answer_that_ends_exactly_at_the_budget_is_not_truncated(tiny_model, tokenizer):
    question, prompt = [Example("2+2", "4")], ["Q: 2+2?\nA:"]
    answer = " so <answer> 4 </answer>"  # 24 ids, the whole budget
    sampling = SamplingParams(max_new_tokens=len(answer), stop=("</answer>",))
    (c,) = run_episodes(Scripted(tokenizer, answer), Guess, question, prompt, sampling, tokenizer)
    assert (c.episode["end"], c.finish_reason, len(c.token_ids)) == ("answer", "stop", 24)
    # a tool call that fills the budget is stepped (the environment sees it) and ends the episode at the budget
    call = " let me see <guess>7</guess>"
    sampling = SamplingParams(max_new_tokens=len(call), stop=("</answer>",))
    (c,) = run_episodes(Scripted(tokenizer, call), Guess, question, prompt, sampling, tokenizer)
    assert (c.episode["end"], c.finish_reason, c.episode["reward"], c.text) == ("max_tokens", "length", 1.0, call)
    # the real engine labels a row that meets its stop string on its last allowed id "stop", and the episode
    # built on it is an answer: the stop is a piece of a free sample (printable ASCII, one id a character) that
    # first appears with its k-th id, and k the budget
    engine = HFEngine(tiny_model, tokenizer, dtype="float32")
    ids = engine.generate(prompt, SamplingParams(max_new_tokens=40, seed=4))[0].token_ids
    k, piece = next((k, tokenizer.decode(ids[k - n : k])) for k in range(4, 41) for n in (2, 3)
                    if tokenizer.decode(ids[k - n : k]).isprintable() and tokenizer.decode(ids[k - n : k]).isascii()
                    and len(tokenizer.decode(ids[k - n : k])) == n
                    and tokenizer.decode(ids[k - n : k]) not in tokenizer.decode(ids[: k - 1]))
    sampling = SamplingParams(max_new_tokens=k, seed=4, stop=(piece,))
    (at_budget,) = engine.generate(prompt, sampling)
    assert (at_budget.finish_reason, at_budget.token_ids) == ("stop", ids[:k])
    (c,) = run_episodes(engine, Guess, question, prompt, sampling, tokenizer)
    assert (c.episode["end"], c.finish_reason, c.token_ids) == ("answer", "stop", ids[:k])


def test_the_overlong_term_counts_the_model_s_ids_against_the_episode_s_budget():
    from rlvr.config import TrainConfig, load_config
    from rlvr.engines.base import Completion
    from rlvr.stages.rollouts import build_reward_fn, score_completions

    base = dict(dataset="arithmetic:steps=1,max=9", rollout_batch_size=2, group_size=2, max_new_tokens=40,
                rewards={"r1_zero": 1.0, "overlong": 1.0}, overlong_buffer=20)
    cfg = load_config(TrainConfig, overrides={**base, "env": "gsm8k_calculator:max_total_tokens=60"})

    def episode(model, observation):  # model ids, then observation ids, then the rest of the model's
        mask = [True] * (model // 2) + [False] * observation + [True] * (model - model // 2)
        return Completion(0, 0, "no answer", list(range(10, 10 + len(mask))), "stop", loss_mask=mask, episode={})

    rollouts = Rollouts([Example("2+2", "4")], ["Q"], [episode(45, 15), episode(30, 20)])
    scores, _ = score_completions(build_reward_fn(cfg, "r1_zero"), rollouts, cfg)
    # budget 60, the penalty from 60 - 20 = 40 model ids: 45 -> (40 - 45) / 20, 30 -> 0 (observations not counted)
    assert [s["reward/overlong"] for s in scores] == [-0.25, 0.0]
    assert [s["reward"] for s in scores] == [-0.25, 0.0]
    # the buffer is checked against the episode's budget, not max_new_tokens
    load_config(TrainConfig, overrides={**base, "overlong_buffer": 50, "env": "gsm8k_calculator:max_total_tokens=60"})
    with pytest.raises(ConfigError, match="overlong_buffer=70 is longer than the episode's budget.*=60"):
        load_config(TrainConfig, overrides={**base, "overlong_buffer": 70,
                                            "env": "gsm8k_calculator:max_total_tokens=60"})


def test_whole_number_options_refuse_fractions_with_the_config(tmp_path, model_dir):
    for option in ("max_total_tokens=150.5", "max_turn_tokens=7.5", "max_turns=2.0", "max_total_tokens=1e3"):
        with pytest.raises(ConfigError, match=f"{option.split('=')[0]}='.*': expected a positive whole number"):
            train_cfg(model_dir, tmp_path / "r", env=f"gsm8k_calculator:{option}")
    env = environment_factory("code_feedback:max_total_tokens=150,tool_timeout_s=2.5,attempt_discount=0.5")
    assert (env.max_total_tokens, env.tool_timeout_s, env.attempt_discount) == (150, 2.5, 0.5)
    assert type(env.max_total_tokens) is int
    with pytest.raises(ValueError, match="tool_timeout_s='nan': expected a positive number"):
        environment_factory("code_feedback:tool_timeout_s=nan")


def test_code_feedback_fails_a_row_whose_tests_do_not_parse_and_refuses_a_math_dataset(tmp_path, model_dir):
    from rlvr.environments.code_feedback import CodeFeedbackEnv

    program = "```python\ndef f(x):\n    return x\n```"
    env = type("Discounted", (CodeFeedbackEnv,), {"attempt_discount": 0.5})(Example("Write f.", "42"))
    assert env.step(program, []) == Observation(done=True, reward=0.0, tool_calls=1)  # as the grader: a failure
    assert env.attempts == [False] and env.reward(program) == 0.0
    with pytest.raises(ConfigError, match="env=code_feedback runs each row's tests.*'arithmetic:steps=1,max=9' is "
                                          "not a code dataset"):
        train_cfg(model_dir, tmp_path / "r", env="code_feedback")
    assert train_cfg(model_dir, tmp_path / "r", env="code_feedback", dataset="code:level=1", prompt="code").env
