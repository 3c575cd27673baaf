"""An online pass-rate curriculum (`curriculum.*`): sample where the signal is.

A group whose G rollouts are all right or all wrong has no reward spread and teaches nothing (80-88 % of GSM8K's
groups from our SFT checkpoint). Every rollout the run draws updates its question's pass-rate statistics, and
the questions fall into pools as prime-rl's difficulty pools do:

    easy     every sample so far right (at least `min_samples` of them)
    hard     every sample so far wrong (at least `min_samples`)
    signal   right and wrong samples both seen: the questions that have taught something
    the rest the questions not yet drawn, in the run's seeded order (DataOrder)

Each batch takes `hard_fraction` and `easy_fraction` of its questions from those pools (a floor, so they are
re-tested: a question the policy could not do may become learnable), `signal_fraction` from the signal pool,
and the rest in the run's order, skipping questions of the easy and hard pools. A pool that is short passes its
share on to the run's order. With no statistics yet every question comes from the order, as without a curriculum.
Draws are a function of (seed, draw count, statistics), so a run is deterministic for a seed; the statistics and
the draw count are saved in checkpoints, so resume is exact.
"""

from __future__ import annotations

import random

from rlvr.tasks.records import DataOrder, Example


class Curriculum:
    """A drop-in for DataOrder's `take(k)` that draws by observed pass rate; `record` feeds it every scored
    rollout, `state` / `load` are what a checkpoint keeps, `metrics` what a step logs."""

    def __init__(self, order: DataOrder, train: list[Example], cfg, key: str):
        self.order, self.cfg, self.key = order, cfg, key
        self.index = {id(example): i for i, example in enumerate(train)}  # the rollouts carry these objects
        self.stats: dict[int, list[int]] = {}  # question index -> [samples, right]
        self.draws = 0
        self.last: dict[str, float] = {}

    # the pools, from the statistics
    def pools(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {"easy": [], "hard": [], "signal": []}
        for i, (n, right) in sorted(self.stats.items()):
            if 0 < right < n:
                out["signal"].append(i)
            elif n >= self.cfg.min_samples:
                out["easy" if right == n else "hard"].append(i)
        return out

    def take(self, k: int) -> list[int]:
        """The next k question indices: the pools' shares, then the run's order without easy or hard ones."""
        rng = random.Random(f"{self.key}-curriculum-{self.draws}")
        self.draws += 1
        pools = self.pools()
        chosen: list[int] = []
        for name, fraction in (("hard", self.cfg.hard_fraction), ("easy", self.cfg.easy_fraction),
                               ("signal", self.cfg.signal_fraction)):
            want = min(round(k * fraction), k - len(chosen))
            chosen += rng.sample(pools[name], min(want, len(pools[name])))
        settled = set(pools["easy"]) | set(pools["hard"])
        for _ in range(4 * self.order.n):  # every question easy or hard: the floor pools fill the rest below
            if len(chosen) == k:
                break
            i = self.order.take(1)[0]
            if i not in settled and i not in chosen:
                chosen.append(i)
        leftover = [i for i in sorted(settled) if i not in chosen]
        chosen += rng.sample(leftover, min(k - len(chosen), len(leftover)))
        while len(chosen) < k:  # fewer questions than a batch: repeat, as DataOrder does across epochs
            chosen.append(self.order.take(1)[0])
        self.last = self._batch_metrics(chosen, pools)
        return chosen

    def pool_metrics(self, pools: dict[str, list[int]]) -> dict[str, float]:
        return {**{f"curriculum/{name}": float(len(ids)) for name, ids in pools.items()},
                "curriculum/seen": float(len(self.stats))}

    def _batch_metrics(self, chosen: list[int], pools: dict[str, list[int]]) -> dict[str, float]:
        known = [self.stats[i] for i in chosen if i in self.stats]
        out = self.pool_metrics(pools)
        out["curriculum/batch_seen_fraction"] = len(known) / len(chosen) if chosen else 0.0
        if known:  # the pass rate this batch was expected to have, from what its questions did before
            out["curriculum/batch_expected_pass_rate"] = sum(right / n for n, right in known) / len(known)
        return out

    def record(self, questions: list[Example], completions, scores: list[dict]) -> None:
        """Every scored rollout: its question's sample count and right answers (answer_reward, the correctness)."""
        for c, score in zip(completions, scores):
            i = self.index.get(id(questions[c.prompt_index]))
            if i is None:
                continue
            n, right = self.stats.get(i, (0, 0))
            self.stats[i] = [n + 1, right + int(float(score["answer_reward"]) > 0.5)]

    def metrics(self, group_size: int, scores: list[dict]) -> dict[str, float]:
        """What the step logs: the pools and the batch's expected pass rate when it was drawn, and how many of
        the trained batch's groups had reward spread."""
        rewards = [float(s["reward"]) for s in scores]
        groups = [rewards[g : g + group_size] for g in range(0, len(rewards), group_size)]
        return {**self.last, "curriculum/groups_with_spread": float(sum(max(g) > min(g) for g in groups if g))}

    def state(self) -> dict:
        return {"stats": {str(i): v for i, v in self.stats.items()}, "draws": self.draws}

    def load(self, state: dict | None) -> None:
        if state:
            self.stats = {int(i): list(v) for i, v in state["stats"].items()}
            self.draws = int(state["draws"])


# ----------------------------------------------------------------------------------------------------
# What the loops call.


def question_sampler(cfg, order: DataOrder, train: list[Example], state: dict | None):
    """The run's question sampler: its DataOrder, or with `curriculum.enabled` a Curriculum around it, restored
    from a checkpoint's `state`."""
    if not cfg.curriculum.enabled:
        return order
    sampler = Curriculum(order, train, cfg.curriculum, f"grpo-{cfg.seed}")
    sampler.load((state or {}).get("curriculum"))
    return sampler


def record_rollouts(sampler, rollouts, scores: list[dict], trained_scores: list[dict], group_size: int) -> dict:
    """Feed a step's scored rollouts (everything sampled, with dynamic sampling) to a curriculum; its metrics, or
    nothing without one. `trained_scores`: the trained batch's, for the groups with spread."""
    if not isinstance(sampler, Curriculum):
        return {}
    sampler.record(rollouts.questions, rollouts.completions, scores)
    return sampler.metrics(group_size, trained_scores)


def sampler_state(sampler) -> dict:
    """What a checkpoint keeps of the sampler beyond the DataOrder's position."""
    return {"curriculum": sampler.state()} if isinstance(sampler, Curriculum) else {}


def first_pass(sampler, engine, model, train: list[Example], prompt, tokenizer, cfg, reward_fn) -> dict:
    """`curriculum.first_pass=N`: before step 1, N questions (in an order of their own, not the run's) sampled
    group_size times each and scored, to seed the statistics; nothing is trained. Returns what it logs."""
    import time

    from rlvr.stages.episodes import generate
    from rlvr.stages.rollouts import Rollouts, rollout_sampling, score_completions

    start = time.perf_counter()
    order = DataOrder(len(train), f"grpo-{cfg.seed}-first-pass")
    per_batch = max(1, cfg.rollout_batch_size // cfg.group_size)
    engine.sync_weights(model)
    left = min(cfg.curriculum.first_pass, len(train))
    while left > 0:
        questions = [train[i] for i in order.take(min(per_batch, left))]
        left -= len(questions)
        prompts = [prompt.format(q.question, tokenizer) for q in questions]
        sampling = rollout_sampling(cfg, prompt, 0)
        rollouts = Rollouts(questions, prompts, generate(engine, cfg.env, questions, prompts, sampling, tokenizer))
        sampler.record(questions, rollouts.completions, score_completions(reward_fn, rollouts, cfg)[0])
    return {**sampler.pool_metrics(sampler.pools()), "time/curriculum_first_pass": time.perf_counter() - start}
