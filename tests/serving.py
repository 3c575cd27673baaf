"""What the server tests share: a tiny chat model (the byte tokenizer of conftest with a ChatML-like template), a
way to make such a model write a given text (a bigram script biasing its output layer), and a server started in a
thread on a free port."""

import json

import torch
from conftest import make_model, make_tokenizer

from rlvr.engines.hf import HFEngine

# ChatML with the byte tokenizer's end token: "<eos>" in the rendered text is the special id 1
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<eos>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

CALL = {"name": "add", "arguments": {"a": 2, "b": 3}}
# whole strings as single ids, so that a bigram script can write a tool call
PIECES = ["<tool_call>", json.dumps(CALL), "</tool_call>", "{not json", "The answer is 5."]
ADD_TOOL = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


def chat_tokenizer(template: str = CHATML):
    tok = make_tokenizer()
    tok.add_tokens(PIECES)
    tok.chat_template = template
    return tok


def chat_model(tokenizer, seed: int = 0, end_bias: float = 2.0):
    """A tiny Llama whose end token is `end_bias` likelier than it would be (completions end at varied lengths)."""
    model = make_model(len(tokenizer), seed=seed)
    bias = torch.zeros(len(tokenizer))
    bias[1] = end_bias
    model.lm_head.register_forward_hook(lambda m, i, out: out + bias.to(out.dtype))
    return model


class Script:
    """Makes the model write `text` when the given id comes before: {previous id: next id}, applied by adding 50 to
    the next id's logit wherever the row's newest input id is a key (a bigram of the output layer; ids not in
    the script keep the model's own distribution). `set(pairs)` replaces the script; `clear()` empties it."""

    def __init__(self, model):
        self.pairs: dict[int, int] = {}
        self.last = None
        model.model.embed_tokens.register_forward_hook(self._seen)
        model.lm_head.register_forward_hook(self._bias)

    def set(self, tokenizer, after: int, texts: list[str]) -> None:
        ids = [after] + [tokenizer.convert_tokens_to_ids(t) for t in texts] + [1]
        self.pairs = dict(zip(ids, ids[1:]))

    def clear(self) -> None:
        self.pairs = {}

    def _seen(self, module, args, out):
        ids = args[0]
        self.last = ids if ids.dim() == 1 else ids[:, -1]

    def _bias(self, module, args, out):
        if not self.pairs or self.last is None:
            return out
        boost = torch.zeros(out.shape[0], out.shape[-1], dtype=out.dtype)
        for row, token in enumerate(self.last.tolist()):
            if token in self.pairs:
                boost[row, self.pairs[token]] = 50.0
        return out + (boost.unsqueeze(1) if out.dim() == 3 else boost)


def start(tokenizer=None, model=None, **options):
    """(handle, engine, model, tokenizer, records): a server in a thread on a free port; records collects every
    CallRecord."""
    from rlvr.serve import start_server

    tokenizer = tokenizer or chat_tokenizer()
    model = model or chat_model(tokenizer)
    engine = HFEngine(model, tokenizer, batch_size=16)
    records = []
    handle = start_server(engine, tokenizer, **{"model_name": "tiny", "on_record": records.append, **options})
    return handle, engine, model, tokenizer, records


def client(handle, **kwargs):
    import openai

    return openai.OpenAI(base_url=kwargs.pop("base_url", handle.base_url), api_key=kwargs.pop("api_key", "unused"),
                         max_retries=0, timeout=kwargs.pop("timeout", 120), **kwargs)
