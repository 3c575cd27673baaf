"""verifiers' v1 tasksets (PyPI `verifiers` 0.4.0, the `rlvr[verifiers]` extra), trained with
`env_class=verifiers:<taskset id>`: each episode is v1's own (`Env.run_slot`: the taskset's task, its `null`
harness program in a local subprocess runtime, its interception server), whose model calls reach rlvr's server
through v1's TrainClient: the task rendered by `renderers` (DefaultRenderer: the tokenizer's chat template), posted
to the episode's `/inference/v1/generate`. rlvr records those calls and trains on them as on any agent's; the
episode's reward is the trace's (the sum of its weighted `@vf.reward`s).

The taskset id is what v1 imports (an installed package whose `__init__` exports one `vf.Taskset`), or a path to
such a package's folder. Rows carry each task's `idx` (`taskset_rows(id, n)` makes them: the first n tasks' data).
What the runtime needs beyond the package index is in docs/agents.md ("verifiers").
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

VERIFIERS = "verifiers:"


def _import(ident: str) -> str:
    """The id v1 imports; a folder's parent goes on sys.path first."""
    path = Path(ident).expanduser()
    if path.is_dir() and (path / "__init__.py").is_file():
        parent = str(path.resolve().parent)
        if parent not in sys.path:
            sys.path.insert(0, parent)
        return path.name
    return ident


def _vf():
    try:
        import verifiers.v1 as vf
    except ImportError as err:
        raise ValueError(f"env_class=verifiers:... needs verifiers' v1 interface: pip install 'rlvr[verifiers]' "
                         f"(verifiers==0.4.0); importing it failed: {err}") from None
    return vf


class VerifiersTaskset:
    """A v1 taskset as an episode runner (rlvr.stages.agents calls `play`)."""

    def __init__(self, ident: str):
        vf = _vf()
        from verifiers.v1.utils.loaders import load_environment

        self.ident = _import(ident)
        self.loop, self.lock = None, threading.Lock()
        self.config = vf.SingleAgentEnvConfig(taskset={"id": self.ident}, agent={
            "runtime": {"type": "subprocess"}, "harness": {"id": "null"}})
        try:
            self.tasks = list(load_environment(self.config).taskset)
        except Exception as err:  # noqa: BLE001 -- v1's loaders raise their own kinds
            raise ValueError(f"env_class=verifiers:{ident}: verifiers cannot load the taskset: "
                             f"{type(err).__name__}: {err}") from None

    async def play(self, client, row: dict, sampling: dict, tokenizer_dir: str) -> dict:
        """One v1 episode of the row's task; its trace's reward (an exception when v1 says it failed). v1 keeps
        asyncio locks across episodes (its runtime's), so its episodes all run on one event loop of their own;
        cancelling this coroutine (the episode's timeout) cancels the episode there."""
        import asyncio

        with self.lock:
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
                threading.Thread(target=self.loop.run_forever, name="rlvr-verifiers", daemon=True).start()
        done = asyncio.run_coroutine_threadsafe(self._episode(client, row, sampling, tokenizer_dir), self.loop)
        return await asyncio.wrap_future(done)

    async def _episode(self, client, row: dict, sampling: dict, tokenizer_dir: str) -> dict:
        vf = _vf()
        from verifiers.v1.utils.loaders import load_environment

        if "idx" not in row:
            raise ValueError("a verifiers episode's row needs the task's `idx` column (rows from taskset_rows)")
        task = self.tasks[int(row["idx"])]
        ctx = vf.ModelContext(model=sampling["model"], client=vf.TrainClientConfig(
            base_url=str(client.base_url), renderer_model_name=tokenizer_dir), sampling=vf.SamplingConfig(
            temperature=sampling["temperature"], max_tokens=sampling["max_tokens"]))
        env = load_environment(self.config)  # the env and its interception server live on this episode's loop
        async with env.serving():
            episode = await env.run_slot(env.slots(task)[0], ctx)
        errors = list(episode.errors) + [e for t in episode.traces for e in t.errors]
        if not episode.ok or not episode.traces:
            raise RuntimeError("verifiers' episode failed: " + "; ".join(str(e)[:200] for e in errors[:2]))
        reward = float(sum(t.reward for t in episode.traces))
        return {"reward": reward, "answer_reward": reward}


def taskset_rows(ident: str, n: int | None = None) -> list[dict]:
    """Rows for a run of `env_class=verifiers:<ident>`: the first n tasks' data (`prompt` as text), with `idx`."""
    tasks = VerifiersTaskset(ident).tasks[:n]
    rows = []
    for task in tasks:
        data = task.data.model_dump(mode="json", exclude_none=True)
        rows.append({**{k: v for k, v in data.items() if isinstance(v, (str, int, float, bool))},
                     "prompt": task.data.prompt_text, "idx": task.data.idx})
    return rows
