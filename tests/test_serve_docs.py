"""docs/serve.md's Python examples run as written against a server started here: a tiny chat model served under
the default model's name at the address the guide uses (the examples' http://127.0.0.1:8000 is pointed at this
server's port), and the in-process example's `load_model("SmolLM2-135M-Instruct")` loading the tiny model saved
to a directory (the one substitution: nothing is downloaded or converted in tests)."""

import re
from pathlib import Path

import pytest
from serving import chat_model, chat_tokenizer, start

pytest.importorskip("fastapi")
pytest.importorskip("openai")

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "serve.md"
BLOCKS = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.DOTALL)


@pytest.fixture(scope="module")
def served():
    handle, *_ = start(model_name="SmolLM2-135M-Instruct")
    yield handle
    handle.stop()


def test_the_guide_has_its_examples():
    assert len(BLOCKS) == 4
    assert any("start_server(" in b for b in BLOCKS) and any("tools=[add]" in b for b in BLOCKS)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_guide_example_runs(index, served, tmp_path, capsys):
    code = BLOCKS[index].replace("http://127.0.0.1:8000", served.url)
    if "load_model(" in code:
        tokenizer = chat_tokenizer()
        chat_model(tokenizer).save_pretrained(tmp_path / "tiny")
        tokenizer.save_pretrained(tmp_path / "tiny")
        code = code.replace('load_model("SmolLM2-135M-Instruct")', f'load_model({str(tmp_path / "tiny")!r})')
    exec(compile(code, f"{GUIDE.name} example {index + 1}", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.strip()  # each example prints what it shows
