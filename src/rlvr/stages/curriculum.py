"""An online pass-rate curriculum (`curriculum.*`): sample where the signal is.

A group whose G rollouts are all right or all wrong has no reward spread and teaches nothing (80-88 % of GSM8K's
groups from our SFT checkpoint). Every rollout the run draws updates its question's pass-rate statistics, which
keep the question's last `window` results only (a policy that learns or forgets a question moves it), and the
questions fall into pools as prime-rl's difficulty pools do:

    easy     every sample in the window right (at least `min_samples` of them)
    hard     every sample in the window wrong (at least `min_samples`)
    signal   right and wrong samples both in the window: the questions that teach something now
    the rest the questions not yet drawn, in the run's seeded order (DataOrder)

Each batch takes `hard_fraction` and `easy_fraction` of its questions from those pools (a floor, so they are
re-tested: a question the policy could not do may become learnable), `signal_fraction` from the signal pool,
and the rest in the run's order, skipping questions of the easy and hard pools. A share is k x fraction
questions in expectation at any batch size k: each pool's credit grows by k x fraction (exact fractions) every
batch and the batch takes its whole part, carrying the rest (at k = 4 and 0.1: one question every 2-3 batches,
where rounding gave none ever). A pool that is short passes its share on to the run's order (the credit is spent
all the same, so an empty pool builds no debt). With no statistics yet every question comes from the order, as
without a curriculum. Draws are a function of (seed, draw count, statistics, credit), so a run is deterministic
for a seed; all four are saved in checkpoints, so resume is exact.
"""

from __future__ import annotations

import random
from fractions import Fraction

from rlvr.tasks.records import DataOrder, Example


class Curriculum:
    """A drop-in for DataOrder's `take(k)` that draws by observed pass rate; `record` feeds it every scored
    rollout, `state` / `load` are what a checkpoint keeps, `metrics` what a step logs."""

    def __init__(self, order: DataOrder, train: list[Example], cfg, key: str):
        self.order, self.cfg, self.key = order, cfg, key
        self.index = {id(example): i for i, example in enumerate(train)}  # the rollouts carry these objects
        self.stats: dict[int, list[int]] = {}  # question index -> its last `window` results, oldest first (1: right)
        self.draws = 0
        self.credit = {name: Fraction(0) for name in _SHARES}  # each pool's share not yet drawn, in questions
        self.last: dict[str, float] = {}

    # the pools, from the statistics
    def pools(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {"easy": [], "hard": [], "signal": []}
        for i, recent in sorted(self.stats.items()):
            n, right = len(recent), sum(recent)
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
        floors: dict[str, int] = {}
        for name in _SHARES:
            # exact: float shares such as 0.1 x 4 would drift when summed over thousands of batches
            self.credit[name] += k * Fraction(str(getattr(self.cfg, f"{name}_fraction")))
            want = int(self.credit[name])  # the whole part; the rest carries to the next batch
            self.credit[name] -= want
            want = min(want, k - len(chosen))
            drawn = rng.sample(pools[name], min(want, len(pools[name])))
            chosen += drawn
            floors[name] = len(drawn)
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
        # what each pool's share gave this batch (the floors firing: at 4 questions and 0.1, a hard one every
        # two or three batches); the order and the leftovers may add more of a pool's questions
        self.last.update({f"curriculum/batch_{name}_share": float(n) for name, n in floors.items()})
        return chosen

    def pool_metrics(self, pools: dict[str, list[int]]) -> dict[str, float]:
        return {**{f"curriculum/{name}": float(len(ids)) for name, ids in pools.items()},
                "curriculum/seen": float(len(self.stats))}

    def _batch_metrics(self, chosen: list[int], pools: dict[str, list[int]]) -> dict[str, float]:
        known = [self.stats[i] for i in chosen if i in self.stats]
        out = self.pool_metrics(pools)
        out["curriculum/batch_seen_fraction"] = len(known) / len(chosen) if chosen else 0.0
        if known:  # the pass rate this batch was expected to have, from what its questions did lately
            out["curriculum/batch_expected_pass_rate"] = sum(sum(r) / len(r) for r in known) / len(known)
        return out

    def record(self, questions: list[Example], completions, scores: list[dict]) -> None:
        """Every scored rollout: its question's result (answer_reward, the correctness) joins its window."""
        for c, score in zip(completions, scores):
            i = self.index.get(id(questions[c.prompt_index]))
            if i is None or float(score["answer_reward"]) != float(score["answer_reward"]):  # NaN: no reward
                continue
            recent = self.stats.setdefault(i, [])
            recent.append(int(float(score["answer_reward"]) > 0.5))
            del recent[: -self.cfg.window]

    def metrics(self, group_size: int, scores: list[dict]) -> dict[str, float]:
        """What the step logs: the pools and the batch's expected pass rate when it was drawn, and how many of
        the trained batch's groups had reward spread."""
        rewards = [float(s["reward"]) for s in scores]
        groups = [rewards[g : g + group_size] for g in range(0, len(rewards), group_size)]
        return {**self.last, "curriculum/groups_with_spread": float(sum(max(g) > min(g) for g in groups if g))}

    def state(self) -> dict:
        # a window is a string of its results, oldest first ("0111": wrong, then right three times)
        return {"stats": {str(i): "".join(map(str, v)) for i, v in self.stats.items()}, "draws": self.draws,
                "credit": {name: str(value) for name, value in self.credit.items()}}

    def load(self, state: dict | None) -> None:
        if not state:
            return
        self.draws = int(state["draws"])
        self.credit = {name: Fraction(state.get("credit", {}).get(name, "0")) for name in _SHARES}
        # a checkpoint of the counting curriculum holds [samples, right] instead, in an order no longer known
        self.stats = {int(i): [int(r) for r in v][-self.cfg.window:] if isinstance(v, str)
                      else _window_like(*v, self.cfg.window) for i, v in state["stats"].items()}


_SHARES = ("hard", "easy", "signal")  # the order a batch fills its floors in


def _window_like(n: int, right: int, window: int) -> list[int]:
    """A window of min(n, window) results at the counts' pass rate, in the pool the counts put the question in."""
    m = min(n, window)
    r = round(m * right / n) if n else 0
    if 0 < right < n:
        r = min(max(r, 1), m - 1) if m > 1 else r
    return [0] * (m - r) + [1] * r


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

    from rlvr.stages.agents import rollout_source
    from rlvr.stages.episodes import generate
    from rlvr.stages.rollouts import Rollouts, rollout_sampling, score_completions

    start = time.perf_counter()
    order = DataOrder(len(train), f"grpo-{cfg.seed}-first-pass")
    per_batch = max(1, cfg.rollout_batch_size // cfg.group_size)
    engine.sync_weights(model)
    left = min(cfg.curriculum.first_pass, len(train))
    source = rollout_source(cfg)
    while left > 0:
        questions = [train[i] for i in order.take(min(per_batch, left))]
        left -= len(questions)
        prompts = [prompt.render(q, tokenizer) for q in questions]
        sampling = rollout_sampling(cfg, prompt, 0)
        rollouts = Rollouts(questions, prompts, generate(engine, source, questions, prompts, sampling, tokenizer))
        sampler.record(questions, rollouts.completions, score_completions(reward_fn, rollouts, cfg)[0])
    return {**sampler.pool_metrics(sampler.pools()), "time/curriculum_first_pass": time.perf_counter() - start}
