"""verifiers' v1 interface through rlvr's server (issue 66): a procedural taskset's episodes run by v1 itself (its
null harness in a subprocess runtime, its TrainClient posting to /inference/v1/generate) during `rlvr train` on a
tiny model; rlvr trains on the ids the engine sampled for them, which are the ids of v1's own trace. Runs where the
`verifiers` extra is installed and its runtime's `uv` is on PATH (docs/agents.md, "verifiers", says what the
runtime fetches); skipped otherwise."""

import json
import shutil
from pathlib import Path

import pytest
from serving import CHATML, chat_model, chat_tokenizer

pytest.importorskip("fastapi")
vf = pytest.importorskip("verifiers.v1", reason="the verifiers extra: pip install 'rlvr[verifiers]'")
# v1's runtime looks for uv in ~/.local/bin too, and pip-installs it there when it is in neither place
if shutil.which("uv") is None and not (Path.home() / ".local" / "bin" / "uv").is_file():
    pytest.skip("verifiers' null harness runs under uv (docs/agents.md, verifiers)", allow_module_level=True)

TASKSET = str(Path(__file__).resolve().parents[1] / "examples" / "agents" / "verifiers_sum")


def test_a_verifiers_taskset_trains_through_the_server(tmp_path, monkeypatch):
    import rlvr
    from rlvr import stages
    from rlvr.environments.verifiers_env import taskset_rows
    from verifiers.v1.env import Env

    traces = []
    run_slot = Env.run_slot

    async def kept(self, *args, **kwargs):
        episode = await run_slot(self, *args, **kwargs)
        traces.extend(episode.traces)
        return episode

    monkeypatch.setattr(Env, "run_slot", kept)
    steps = []
    score = stages.score_rollouts
    monkeypatch.setattr(stages, "score_rollouts", lambda rollouts, *a, **k: steps.append(
        (rollouts, score(rollouts, *a, **k))) or steps[-1][1])
    tokenizer = chat_tokenizer(CHATML)
    chat_model(tokenizer).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    rows = taskset_rows(TASKSET, 20)
    assert rows[3]["idx"] == 3 and rows[3]["prompt"].startswith("What is")
    run = rlvr.train(model=str(tmp_path / "tiny"), env_class=f"verifiers:{TASKSET}", train_dataset=rows,
                     prompt="row", out=str(tmp_path / "run"), steps=1, rollout_batch_size=4, group_size=2,
                     max_new_tokens=8, eval_every=0, eval_at_start=False, eval_at_end=False, precision="fp32",
                     generation_dtype="float32", tensorboard=False)
    metrics = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert metrics["agent/failed"] == 0 and metrics["agent/calls"] >= 1
    (rollouts, scored), = steps
    # v1's trace of each episode holds the very ids rlvr trains on it: its branch is the sequence
    trained = sorted(tuple(s.full) for c in rollouts.completions for s in c.sequences)
    branches = sorted(tuple(b.token_ids) for t in traces for b in t.branches)
    assert trained == branches and len(trained) >= 4
    assert [s["reward"] for s in scored.scores] == [c.episode["reward"]["reward"] for c in rollouts.completions]
