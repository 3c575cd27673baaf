"""`rlvr serve` with the real `openai` client against a server started on a free port (a tiny model): the wire
fields, token ids equal to what the engine samples for the same seed, log-probs equal to the policy's own scoring,
streaming, n > 1, tools, the two-turn prefix property, episodes and the trainer's hooks (issue 65)."""

import json
import threading

import httpx
import pytest
import torch
from serving import ADD_TOOL, CALL, PIECES, Script, chat_model, chat_tokenizer, client, start

from rlvr.engines.base import SamplingParams
from rlvr.engines.hf import HFEngine

pytest.importorskip("fastapi")
pytest.importorskip("openai")

HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]


@pytest.fixture(scope="module")
def served():
    tokenizer = chat_tokenizer()
    model = chat_model(tokenizer)
    script = Script(model)
    handle, engine, model, tokenizer, records = start(tokenizer, model)
    handle.script = script
    yield handle, engine, model, tokenizer, records
    handle.stop()


def _prompt(tokenizer, messages):
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _scored(model, prompt_ids, ids, temperature=1.0):
    """The policy's own log-probs of `ids` after `prompt_ids` (one fp32 forward of the whole sequence)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + ids])).logits[0, len(prompt_ids) - 1:-1].float() / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids).unsqueeze(-1)).squeeze(-1)


def test_models_lists_the_served_model_with_its_context(served):
    handle = served[0]
    models = client(handle).models.list().data
    assert [m.id for m in models] == ["tiny"] and models[0].max_model_len == 1024


def test_chat_token_ids_are_the_engines_and_log_probs_the_policys_scoring(served):
    handle, engine, model, tokenizer, _ = served
    answer = client(handle).chat.completions.create(
        model="tiny", messages=HELLO, n=3, seed=11, temperature=0.8, max_tokens=12, logprobs=True, top_logprobs=3,
        extra_body={"return_token_ids": True})
    prompt = tokenizer(_prompt(tokenizer, HELLO), add_special_tokens=False).input_ids
    assert answer.prompt_token_ids == prompt
    reference = engine.generate([prompt], SamplingParams(temperature=0.8, max_new_tokens=12, n=3, seed=11,
                                                         logprobs=True))
    assert [c.token_ids for c in answer.choices] == [r.token_ids for r in reference]
    assert len({tuple(c.token_ids) for c in answer.choices}) == 3  # n samples, each its own stream
    for choice, ref in zip(answer.choices, reference):
        logprobs = [t.logprob for t in choice.logprobs.content]
        torch.testing.assert_close(torch.tensor(logprobs), _scored(model, prompt, choice.token_ids, 0.8),
                                   atol=2e-5, rtol=0)
        assert choice.finish_reason == ref.finish_reason
        top = choice.logprobs.content[0].top_logprobs
        assert len(top) == 3 and top[0].logprob >= top[1].logprob >= top[2].logprob
        ended = ref.finish_reason == "stop"
        assert choice.message.content == tokenizer.decode(ref.token_ids[:-1] if ended else ref.token_ids,
                                                          skip_special_tokens=True)
    assert answer.usage.prompt_tokens == len(prompt)
    assert answer.usage.completion_tokens == sum(len(c.token_ids) for c in answer.choices)


def test_completions_take_text_or_token_ids_and_several_prompts(served):
    handle, engine, model, tokenizer, _ = served
    api = client(handle)
    ids = tokenizer("Once upon a time", add_special_tokens=False).input_ids
    args = dict(model="tiny", max_tokens=8, seed=4, logprobs=2, extra_body={"return_token_ids": True})
    by_text = api.completions.create(prompt="Once upon a time", **args)
    by_ids = api.completions.create(prompt=ids, **args)
    assert by_text.choices[0].token_ids == by_ids.choices[0].token_ids
    assert by_text.choices[0].prompt_token_ids == ids
    logprobs = by_text.choices[0].logprobs
    assert len(logprobs.token_logprobs) == len(by_text.choices[0].token_ids) and len(logprobs.top_logprobs[0]) == 2
    torch.testing.assert_close(torch.tensor(logprobs.token_logprobs),
                               _scored(model, ids, by_text.choices[0].token_ids), atol=2e-5, rtol=0)
    two = api.completions.create(prompt=[ids, [5, 6, 7]], n=2, **args)
    assert [c.index for c in two.choices] == [0, 1, 2, 3]
    reference = engine.generate([ids, [5, 6, 7]], SamplingParams(max_new_tokens=8, n=2, seed=4))
    assert [c.token_ids for c in two.choices] == [r.token_ids for r in reference]
    echoed = api.completions.create(model="tiny", prompt="Once", max_tokens=3, seed=1, echo=True)
    assert echoed.choices[0].text.startswith("Once")


def test_a_streamed_chat_is_the_whole_answer_in_pieces(served):
    handle = served[0]
    api = client(handle)
    args = dict(model="tiny", messages=HELLO, n=2, seed=5, max_tokens=16, logprobs=True,
                extra_body={"return_token_ids": True})
    whole = api.chat.completions.create(**args)
    texts, ids, logprobs, finish = ["", ""], [[], []], [[], []], [None, None]
    chunks = api.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args)
    usage = None
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            ids[choice.index] += getattr(choice, "token_ids", None) or []
            logprobs[choice.index] += [t.logprob for t in (choice.logprobs.content if choice.logprobs else [])]
            finish[choice.index] = choice.finish_reason or finish[choice.index]
    for k, choice in enumerate(whole.choices):
        assert texts[k] == choice.message.content and ids[k] == choice.token_ids
        assert logprobs[k] == [t.logprob for t in choice.logprobs.content]
        assert finish[k] == choice.finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_a_stop_string_ends_the_text_before_it_and_the_ids_at_it(served):
    handle, engine, _, tokenizer, _ = served
    api = client(handle)
    free = api.completions.create(model="tiny", prompt="abc", max_tokens=30, seed=2,
                                  extra_body={"return_token_ids": True, "ignore_eos": True}).choices[0]
    stop = free.text[10:12]
    cut = api.completions.create(model="tiny", prompt="abc", max_tokens=30, seed=2, stop=[stop],
                                 extra_body={"return_token_ids": True, "ignore_eos": True}).choices[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == free.text[: free.text.find(stop)]
    assert cut.token_ids == free.token_ids[: len(cut.token_ids)]
    assert stop in tokenizer.decode(cut.token_ids) and len(cut.token_ids) < 30


def test_the_same_seed_gives_the_same_tokens_alone_or_joining_a_batch(served):
    handle = served[0]
    api = client(handle)
    args = dict(model="tiny", messages=HELLO, seed=21, max_tokens=20, extra_body={"return_token_ids": True,
                                                                                  "ignore_eos": True})
    alone = api.chat.completions.create(**args).choices[0].token_ids
    results, errors = {}, []

    def call(k):
        try:
            messages = HELLO if k == 0 else [{"role": "user", "content": "x" * (5 * k)}]
            results[k] = api.chat.completions.create(**{**args, "messages": messages, "seed": 21 if k == 0 else k}
                                                     ).choices[0].token_ids
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=call, args=(k,)) for k in range(8)]
    for t in threads[1:]:
        t.start()
    threads[0].start()  # joins a batch that is already decoding
    for t in threads:
        t.join()
    assert not errors and results[0] == alone
    assert handle.scheduler.stats["steps"] > 0


def test_generate_is_token_in_token_out(served):
    handle, engine, model, _, _ = served
    body = {"token_ids": [40, 41, 42, 43], "sampling_params": {"max_tokens": 6, "n": 2, "seed": 9, "logprobs": 1,
                                                               "temperature": 1.0}}
    answer = httpx.post(handle.url + "/inference/v1/generate", json=body, timeout=60).json()
    reference = engine.generate([[40, 41, 42, 43]], SamplingParams(max_new_tokens=6, n=2, seed=9))
    assert [c["token_ids"] for c in answer["choices"]] == [r.token_ids for r in reference]
    for choice in answer["choices"]:
        got = torch.tensor([t["logprob"] for t in choice["logprobs"]["content"]])
        torch.testing.assert_close(got, _scored(model, [40, 41, 42, 43], choice["token_ids"]), atol=2e-5, rtol=0)
        assert choice["finish_reason"] in ("stop", "length")
        # each token named by its id, as vLLM's route names it (what verifiers' renderers check)
        assert [t["token"] for t in choice["logprobs"]["content"]] == [f"token_id:{i}" for i in choice["token_ids"]]


def test_tokenize_and_detokenize_agree_with_the_chat_prompt(served):
    handle, _, _, tokenizer, _ = served
    ids = httpx.post(handle.url + "/tokenize", json={"messages": HELLO}).json()["tokens"]
    assert ids == tokenizer(_prompt(tokenizer, HELLO), add_special_tokens=False).input_ids
    assert httpx.post(handle.url + "/detokenize", json={"tokens": ids}).json()["prompt"] == tokenizer.decode(ids)
    counted = httpx.post(handle.url + "/tokenize", json={"prompt": "hello"}).json()
    assert counted["count"] == 5 and counted["max_model_len"] == 1024


def test_tool_calls_are_parsed_rendered_and_continued_token_exactly(served):
    handle, _, _, tokenizer, records = served
    api = client(handle)
    newline = tokenizer.convert_tokens_to_ids("Ċ")  # the byte tokenizer's "\n": the generation prompt's last id
    handle.script.set(tokenizer, newline, PIECES[:3])
    try:
        first = api.chat.completions.create(model="tiny", messages=HELLO, tools=[ADD_TOOL], seed=1, max_tokens=10,
                                            extra_body={"return_token_ids": True})
        streamed = api.chat.completions.create(model="tiny", messages=HELLO, tools=[ADD_TOOL], seed=1, max_tokens=10,
                                               stream=True)
        calls = [t for chunk in streamed for c in chunk.choices for t in (c.delta.tool_calls or [])]
    finally:
        handle.script.clear()
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("add", CALL["arguments"])]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("add", CALL["arguments"])]
    # the tools were described to the model (its template has no tool format): rlvr's tool prompt
    assert "<tools>" in tokenizer.decode(first.prompt_token_ids) and '"name": "add"' in tokenizer.decode(
        first.prompt_token_ids)
    # the agent answers the call; the second prompt holds the first prompt and the sampled ids unchanged
    second = api.chat.completions.create(
        model="tiny", max_tokens=4, seed=2, tools=[ADD_TOOL], extra_body={"return_token_ids": True},
        messages=HELLO + [choice.message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": choice.message.tool_calls[0].id, "content": "5"}])
    sampled = first.prompt_token_ids + choice.token_ids
    assert second.prompt_token_ids[: len(sampled)] == sampled
    assert "<tool_response>\n5\n</tool_response>" in tokenizer.decode(second.prompt_token_ids[len(sampled):])
    assert records[-1].spliced_turns == 1


def test_a_tool_call_that_does_not_parse_is_plain_content(served):
    handle, _, _, tokenizer, _ = served
    newline = tokenizer.convert_tokens_to_ids("Ċ")
    handle.script.set(tokenizer, newline, ["<tool_call>", "{not json", "</tool_call>"])
    try:
        answer = client(handle).chat.completions.create(model="tiny", messages=HELLO, tools=[ADD_TOOL], seed=1,
                                                         max_tokens=10)
    finally:
        handle.script.clear()
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content == "<tool_call>{not json</tool_call>"


def test_records_carry_the_episode_the_sampled_ids_and_their_log_probs(served):
    handle, _, _, tokenizer, records = served
    api = client(handle, base_url=handle.episode_url("episode 7"))
    answer = api.chat.completions.create(model="tiny", messages=HELLO, seed=3, max_tokens=6,
                                         extra_body={"return_token_ids": True})
    record = records[-1]
    assert record.episode == "episode 7" and record.endpoint == "chat.completions" and record.seed == 3
    assert record.prompt_ids == answer.prompt_token_ids
    assert record.samples[0].token_ids == answer.choices[0].token_ids
    assert len(record.samples[0].logprobs) == len(record.samples[0].token_ids)  # recorded though not asked for
    assert record.samples[0].finish_reason == answer.choices[0].finish_reason
    httpx.post(handle.url + "/v1/completions", headers={"X-Episode-Id": "by-header"},
               json={"prompt": "hi", "max_tokens": 2})
    assert records[-1].episode == "by-header" and records[-1].endpoint == "completions"


def test_the_two_turn_prefix_holds_with_a_bpe_tokenizer_only_because_sampled_ids_are_reused():
    """A BPE model samples splits of words that tokenising its text again would merge: the second prompt starts
    with the first prompt + the sampled ids because the server puts the ids back (reuse_sampled_ids), and not
    without it. A template that rewrites an earlier turn gets the template's text tokenised, never a splice."""
    from test_rollout import _bpe_tokenizer

    tokenizer = _bpe_tokenizer()

    def turns(reuse, template=CHATML_BPE):
        """(second prompt starts with first prompt + sampled ids, it is its text tokenised, first turn) per seed"""
        tokenizer.chat_template = template
        handle, *_ = start(tokenizer, chat_model(tokenizer, seed=2, end_bias=0.0), reuse_sampled_ids=reuse)
        try:
            api, out = client(handle), []
            for seed in range(6):
                user = [{"role": "user", "content": "<answer> 5"}]
                first = api.chat.completions.create(model="tiny", messages=user, seed=seed, max_tokens=12,
                                                    extra_body={"return_token_ids": True})
                again = user + [{"role": "assistant", "content": first.choices[0].message.content},
                                {"role": "user", "content": "x = 12"}]
                second = api.chat.completions.create(model="tiny", max_tokens=1, messages=again,
                                                     extra_body={"return_token_ids": True})
                sampled = first.prompt_token_ids + first.choices[0].token_ids
                plain = tokenizer(_prompt(tokenizer, again), add_special_tokens=False).input_ids
                out.append((second.prompt_token_ids[: len(sampled)] == sampled, second.prompt_token_ids == plain,
                            first.choices[0].message.content))
            return out
        finally:
            handle.stop()

    assert all(held for held, _, _ in turns(True))
    unspliced = turns(False)
    assert all(plain for _, plain, _ in unspliced) and not all(held for held, _, _ in unspliced)
    rewritten = turns(True, CHATML_BPE.replace("m['content']", "m['content'] | upper"))
    changed = [plain for _, plain, text in rewritten if text.upper() != text]
    assert changed and all(changed)


CHATML_BPE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<eos>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_sync_weights_between_steps_serves_the_new_policy():
    """The trainer's weight sync (issue 66): the served engine samples from the new weights, as a fresh engine of
    them does for the same seed."""
    handle, engine, model, tokenizer, _ = start()
    try:
        api = client(handle)
        ask = dict(model="tiny", messages=HELLO, seed=8, max_tokens=10, extra_body={"return_token_ids": True})
        before = api.chat.completions.create(**ask).choices[0].token_ids
        trained = chat_model(tokenizer, seed=5)
        handle.sync_weights(trained)
        after = api.chat.completions.create(**ask)
        fresh = HFEngine(trained, tokenizer).generate([after.prompt_token_ids],
                                                      SamplingParams(max_new_tokens=10, seed=8))[0]
        assert after.choices[0].token_ids == fresh.token_ids != before
    finally:
        handle.stop()


def test_streamed_completions_with_stop_strings_kept_and_ids_as_tokens(served):
    handle = served[0]
    api = client(handle)
    args = dict(model="tiny", prompt=["Once upon", "abc"], n=2, seed=6, max_tokens=20, logprobs=1,
                extra_body={"return_token_ids": True, "ignore_eos": True, "return_tokens_as_token_ids": True})
    whole = api.completions.create(**args)
    texts, ids = [""] * 4, [[] for _ in range(4)]
    for chunk in api.completions.create(stream=True, **args):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            ids[choice.index] += choice.token_ids or []
    assert texts == [c.text for c in whole.choices] and ids == [c.token_ids for c in whole.choices]
    assert whole.choices[0].logprobs.tokens == [f"token_id:{i}" for i in whole.choices[0].token_ids]
    stop = whole.choices[0].text[5:7]
    kept = api.completions.create(**{**args, "prompt": "Once upon", "n": 1, "stop": [stop],
                                     "extra_body": {**args["extra_body"], "include_stop_str_in_output": True}})
    assert kept.choices[0].text == whole.choices[0].text[: whole.choices[0].text.find(stop) + len(stop)]


def test_tool_parsers_hand_values(tmp_path):
    from rlvr.serve.tools import load_parser, parse_hermes, parse_turn

    two = 'Let me add. <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>\n<tool_call>{"name": "neg", ' \
          '"arguments": "{\\"x\\": 2}"}'  # the second block cut by the end of the turn
    assert parse_turn(parse_hermes, two) == ("Let me add.", [{"name": "add", "arguments": '{"a": 1}'},
                                                            {"name": "neg", "arguments": '{"x": 2}'}])
    for broken in ("<tool_call>{not json</tool_call>", '<tool_call>{"arguments": {}}</tool_call>',
                   '<tool_call>{"name": "f", "arguments": "not json"}</tool_call>', "no call at all"):
        assert parse_turn(parse_hermes, broken) == (broken, [])
    (tmp_path / "mine.py").write_text("def parse(text):\n    if text.startswith('CALL '):\n"
                                      "        return None, [{'name': text[5:], 'arguments': {}}]\n"
                                      "    raise RuntimeError('not mine')\n")
    mine = load_parser(f"{tmp_path / 'mine.py'}:parse")
    assert parse_turn(mine, "CALL ping") == (None, [{"name": "ping", "arguments": "{}"}])
    assert parse_turn(mine, "hello") == ("hello", [])  # a parser that raises leaves plain content
    for bad in ("nonsense", f"{tmp_path / 'missing.py'}:parse", f"{tmp_path / 'mine.py'}:nothing"):
        with pytest.raises(ValueError, match="tool_parser="):
            load_parser(bad)


def test_an_unfinished_lora_run_serves_its_latest_checkpoint_merged(tmp_path):
    from rlvr.core.checkpoint import save_checkpoint, save_final
    from rlvr.core.models import load_model, prepare_for_training
    from rlvr.serve.server import load_served_model, resolve_served_model

    tokenizer = chat_tokenizer()
    chat_model(tokenizer).save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    base, _ = load_model(str(tmp_path / "base"))
    policy = prepare_for_training(base, lora_rank=2)
    with torch.no_grad():  # a trained adapter: its B matrices are no longer zero
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    run = tmp_path / "run"
    save_checkpoint(run, 3, policy, tokenizer, {"step": 3})
    target, note = resolve_served_model(str(run))
    assert target.endswith("step_000003") and "has not finished" in note
    served, served_tokenizer = load_served_model(str(run))
    ids = torch.tensor([[5, 6, 7, 8]])
    policy.eval()
    with torch.no_grad():
        torch.testing.assert_close(served(ids).logits, policy(ids).logits, atol=1e-5, rtol=0)
    assert served_tokenizer.chat_template == tokenizer.chat_template
    save_final(run, chat_model(tokenizer, seed=4), tokenizer, {"steps": 3})  # a finished run: its final/ model
    assert resolve_served_model(str(run))[0] == str(run / "final")


def test_an_episode_gets_back_its_own_sampled_ids_only(served):
    handle, _, _, tokenizer, records = served
    first = client(handle, base_url=handle.episode_url("a")).chat.completions.create(
        model="tiny", messages=HELLO, seed=4, max_tokens=6, extra_body={"return_token_ids": True})
    again = HELLO + [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And 3+4?"}]
    for episode, spliced in (("a", 1), ("b", 0)):
        client(handle, base_url=handle.episode_url(episode)).chat.completions.create(
            model="tiny", messages=again, max_tokens=1)
        assert records[-1].episode == episode and records[-1].spliced_turns == spliced
    tokens = httpx.post(handle.episode_url("a").removesuffix("/v1") + "/tokenize", json={"messages": again}).json()
    assert tokens["tokens"][: len(first.prompt_token_ids)] == first.prompt_token_ids
