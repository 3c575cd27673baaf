"""Ray roles (rlvr.distributed) on a local Ray: synchronous mode is the local loop, asynchronous mode keeps its
staleness bound, weights reach every worker, a dead or silent role stops the run with its name."""

import math

import pytest
import torch

ray = pytest.importorskip("ray")

from safetensors.torch import load_file  # noqa: E402

from conftest import train_cfg  # noqa: E402
from rlvr import stages
from rlvr.core.tracking import read_jsonl  # noqa: E402
from rlvr.distributed import driver, placement, roles  # noqa: E402
from rlvr.training import rl as train_module  # noqa: E402


def parity_reward(response: str, ground_truth: str) -> dict:
    r = float(sum(map(ord, response)) % 2)
    return {"reward": r, "format_reward": 0.0, "answer_reward": r}


@pytest.fixture(autouse=True)
def _parity(monkeypatch):
    monkeypatch.setattr(stages, "build_reward_fn", lambda cfg, name: parity_reward)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}})
    yield
    ray.shutdown()


def _cfg(model_dir, out, **kw):
    return train_cfg(model_dir, out, **{"log_rollouts_every": 0, **kw})


def _metrics(out):
    return [{k: v for k, v in row.items() if not k.startswith(("time", "async/")) and k != "val/seconds"}
            for row in read_jsonl(out / "metrics.jsonl")]


def _weights(out):
    return load_file(str(out / "final" / "model.safetensors"))


def test_synchronous_mode_is_the_local_loop(tmp_path, model_dir):
    # Two workers decode other batch shapes than one engine, which rounds the engine's sampling log-probs
    # differently in the last bits (1e-7 here); the rollout correction trains on those, so the runs of two
    # workers compare the loops with the correction off, and one worker (the same batch shapes) with it on.
    off = {"rollout_correction.mode": "none"}
    for name, extra in (("one_worker", {"distributed.rollout_workers": 1, "async.max_staleness": 0}),
                        ("two_workers", {"distributed.rollout_workers": 2, **off}),
                        ("broadcast", {"distributed.rollout_workers": 2, "distributed.weight_sync": "broadcast",
                                       **off})):
        local = tmp_path / ("local_off" if "rollout_correction.mode" in extra else "local")
        if not local.exists():
            train_module.train_grpo(_cfg(model_dir, local, **{k: v for k, v in extra.items()
                                                              if k.startswith("rollout_correction")}))
        out = tmp_path / name
        train_module.train_grpo(_cfg(model_dir, out, **extra))
        got, want = _metrics(out), _metrics(local)
        if name != "one_worker":
            # each worker decodes half the prompts: the same tokens (every row has its own random stream), but
            # a different batch shape rounds the sampler's entropies and log-probs differently in the last bits;
            # the mismatch diagnostics measure exactly those log-probs against the learner's (one float32 ulp of a
            # log-prob near 5 is 4.8e-7; CI saw 2^-21 against 2^-20), so they agree to rounding, not bitwise
            for g, w in zip(got, want):
                for key, tol in (("train/token_entropy", dict(rel=1e-6)),
                                 ("train/mismatch_max_abs_log_ratio", dict(abs=2e-6)),
                                 ("train/mismatch_kl", dict(abs=1e-9))):
                    if key in w:
                        assert g.pop(key) == pytest.approx(w.pop(key), **tol), (name, key)
        assert got == want, name
        for key, value in _weights(local).items():
            assert torch.equal(_weights(out)[key], value), (name, key)


def test_two_learners_in_the_loop_make_the_local_updates(tmp_path, model_dir):
    local, dist = tmp_path / "local", tmp_path / "dist"
    train_module.train_grpo(_cfg(model_dir, local, loss_normalization="token"))
    train_module.train_grpo(_cfg(model_dir, dist, loss_normalization="token", **{"distributed.rollout_workers": 1,
                                                                                 "distributed.learners": 2}))
    a, b = _metrics(local), _metrics(dist)
    assert [m.get("train/reward") for m in a] == [m.get("train/reward") for m in b]  # the same rollouts
    for x, y in zip(a, b):
        for key in ("train/loss", "train/grad_norm", "train/trained_tokens"):
            if key in x:
                assert y[key] == pytest.approx(x[key], rel=1e-4, abs=1e-6), key
    for key, value in _weights(local).items():
        torch.testing.assert_close(_weights(dist)[key], value, atol=1e-5, rtol=0, msg=key)


def _straight_and_killed(tmp_path, model_dir, crash_at, kw, inspect=lambda killed: None):
    """A straight run, and one killed at step 3 (after its step-2 checkpoint; `inspect(killed)` then) and resumed."""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    train_module.train_grpo(_cfg(model_dir, straight, **kw))
    undo = crash_at(3)
    with pytest.raises(KeyboardInterrupt):
        train_module.train_grpo(_cfg(model_dir, killed, **kw))
    undo()
    inspect(killed)
    train_module.train_grpo(_cfg(model_dir, killed, resume=True, **kw))
    return straight, killed


def test_resume_after_a_kill_continues_exactly(tmp_path, model_dir, crash_at):
    straight, killed = _straight_and_killed(tmp_path, model_dir, crash_at, {"distributed.rollout_workers": 1,
                                                                            "save_every": 2, "steps": 4})
    assert _metrics(killed) == _metrics(straight)


def test_asynchronous_mode_keeps_staleness_within_its_bound(tmp_path, model_dir):
    out = tmp_path / "async"
    # two optimizer steps a rollout batch: K=1 bounds the versions (batches), so up to 2 optimizer steps
    train_module.train_grpo(_cfg(model_dir, out, steps=5, algorithm="offpolicy_clip", steps_per_rollout=2,
                                 **{"distributed.rollout_workers": 2, "async.max_staleness": 1}))
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "async/staleness" in r]
    assert len(rows) == 5
    assert all(0 <= r["async/staleness"] <= 1 for r in rows)
    assert all(r["async/staleness_optimizer_steps"] == 2 * r["async/staleness"] for r in rows)
    assert any(r["async/staleness"] == 1 for r in rows)  # the pipeline really overlapped
    last = rows[-1]
    assert last["async/staleness_0"] + last["async/staleness_1"] == 5
    assert last["async/dropped_batches"] >= 0
    assert 0 <= last["time/learner_idle_fraction"] <= 1
    trained = [r for r in rows if "train/is_weight_mean" in r]
    assert trained and all(0 < r["train/is_weight_mean"] <= 2.0 and r["train/is_weight_max"] <= 2.0 for r in trained)
    # a random tiny model writes invalid UTF-8, whose re-tokenised text differs from the sampled bytes; the
    # sampled ids are trained, so every row keeps its sampling-time log-probs
    assert all(r["async/behaviour_unknown_rows"] == 0 for r in rows)


def _questions_by_step(out):
    by_step: dict = {}
    for row in read_jsonl(out / "rollouts.jsonl"):
        by_step.setdefault(row["step"], []).append(row["question"])
    return by_step


def test_batches_in_flight_at_a_checkpoint_are_generated_again_on_resume(tmp_path, model_dir, crash_at):
    # one worker and K=1: batch t is always the one trained at step t, so each step's questions are known; the
    # checkpoint after step 2 is written while batch 3 is generating
    kw = {"distributed.rollout_workers": 1, "async.max_staleness": 1, "save_every": 2, "steps": 4,
          "log_rollouts_every": 1}

    def in_flight_at_the_checkpoint(killed):
        state = torch.load(killed / "checkpoints" / "step_000002" / "trainer_state.pt", weights_only=False)
        assert [index for index, _ in state["driver"]["in_flight"]] == [3]

    straight, killed = _straight_and_killed(tmp_path, model_dir, crash_at, kw, in_flight_at_the_checkpoint)
    assert _questions_by_step(killed) == _questions_by_step(straight)  # batch 3's questions are not skipped
    rows = [r for r in read_jsonl(killed / "metrics.jsonl") if "async/staleness" in r]
    assert [r["async/requeued_batches"] for r in rows] == [0, 0, 1, 1]


class _PushFails(roles.RolloutWorker):
    def set_weights(self, weights, version):
        if version >= 2:
            raise OSError("no space left on device")
        return super().set_weights(weights, version)


@pytest.mark.timeout(180)
def test_a_failed_weight_push_stops_an_async_run_naming_it(tmp_path, model_dir, monkeypatch):
    # the worker would go on generating with the step-1 weights, every batch too stale to train: no end
    import sys

    from ray import cloudpickle

    this = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(this)  # the actors cannot import this test module: ship _PushFails
    monkeypatch.setattr(roles, "RolloutWorker", _PushFails)
    cfg = _cfg(model_dir, tmp_path / "run", steps=6, **{"distributed.rollout_workers": 1, "async.max_staleness": 1})
    try:
        with pytest.raises(placement.RoleFailed,
                           match=r"rollout worker 0 raised \(sending the step-2 weights\).*no space"):
            train_module.train_grpo(cfg)
    finally:
        cloudpickle.unregister_pickle_by_value(this)


def test_a_request_the_cluster_cannot_hold_fails_at_once_saying_what_it_has(tmp_path, model_dir):
    # the test cluster has 4 CPUs and no GPU; Ray alone would wait for resources that never come
    cfg = _cfg(model_dir, tmp_path / "run", **{"distributed.rollout_workers": 1, "distributed.learners": 2,
                                               "distributed.learner_num_cpus": 3})
    with pytest.raises(placement.RoleFailed, match=r"infeasible: CPU: asked for 7, the cluster has 4 \(2 learners x 3 CPU"):
        roles.Roles(cfg)
    cfg = _cfg(model_dir, tmp_path / "run", **{"distributed.rollout_workers": 1, "distributed.rollout_num_gpus": 1})
    with pytest.raises(placement.RoleFailed, match=r"GPU: asked for 1, the cluster has 0; no node has a rollout worker's"):
        roles.Roles(cfg)
    # enough in total, but split over two nodes: a learner needs one node with 6 CPUs
    nodes = [{"Alive": True, "Resources": {"CPU": 4.0}}, {"Alive": True, "Resources": {"CPU": 4.0}},
             {"Alive": False, "Resources": {"CPU": 64.0}}]
    cfg = _cfg(model_dir, tmp_path / "run", **{"distributed.rollout_workers": 1, "distributed.learner_num_cpus": 6})
    with pytest.raises(placement.RoleFailed, match=r"no node has a learner's 6 CPU \+ 0 GPU"):
        placement.check_feasible(cfg, nodes)
    placement.check_feasible(cfg.model_copy(update={"distributed": cfg.distributed.model_copy(
        update={"learner_num_cpus": 4.0})}), nodes)


def test_learners_wait_for_their_placement_group_no_longer_than_its_timeout(tmp_path, model_dir):
    from ray.util.placement_group import placement_group, remove_placement_group

    busy = placement_group([{"CPU": 3}])  # another job holds 3 of the 4 CPUs
    ray.get(busy.ready(), timeout=30)
    try:
        cfg = _cfg(model_dir, tmp_path / "run", **{"distributed.rollout_workers": 1, "distributed.learners": 2,
                                                   "distributed.ready_timeout_s": 1})
        with pytest.raises(placement.RoleFailed, match=r"could not place 2 learners x \{'CPU': 1.0\} within "
                                                      r"distributed.ready_timeout_s=1 s"):
            roles.Roles(cfg)
    finally:
        remove_placement_group(busy)


_SHIPPED = """
import json, sys
import ray
from rlvr.config import TrainConfig
env, payload, elsewhere = json.loads(sys.argv[1])
ray.init(num_cpus=1, include_dashboard=False, runtime_env=env)

@ray.remote
def spec_name(payload):  # a worker process, with neither the file's directory on its path nor its path
    assert elsewhere not in sys.path
    return TrainConfig.model_validate(payload).estimator.advantage  # "rloo": registered by the shipped file

print(ray.get(spec_name.remote(payload), timeout=120))
"""


def test_a_file_estimator_travels_to_nodes_that_do_not_have_it(tmp_path, model_dir):
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from rlvr.core.imports import file_module_name

    est = tmp_path / "elsewhere" / "my_rloo.py"
    est.parent.mkdir()
    shutil.copy(Path(__file__).parents[1] / "examples" / "custom_estimator.py", est)
    cfg = _cfg(model_dir, tmp_path / "run", **{"distributed.rollout_workers": 1, "algorithm": f"{est}:RLOO"})
    env, payload = placement.shipped(cfg)
    name = file_module_name(est, "algorithm")
    assert payload["algorithm"] == f"{name}:RLOO" and Path(env["py_modules"][-1]).name == f"{name}.py"
    # runtime_env uploads only at ray.init (job level): a Ray of its own, from another directory
    run = subprocess.run([sys.executable, "-c", _SHIPPED, json.dumps([env, payload, str(est.parent)])],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == cfg.estimator.advantage == "rloo"


_SHIPPED_REWARD = """
import json, sys
import ray
from rlvr.config import TrainConfig
from rlvr.tasks.records import Example
from rlvr.tasks.reward_base import RewardContext, score_batch
from rlvr.tasks.task import build_reward_fn, task_prompt
env, payload, elsewhere = json.loads(sys.argv[1])
ray.init(num_cpus=1, include_dashboard=False, runtime_env=env)

@ray.remote
def score(payload):  # a worker without the reward file's directory: it imports the shipped copy
    assert elsewhere not in sys.path
    cfg = TrainConfig.model_validate(payload)
    fn = build_reward_fn(cfg, task_prompt(cfg))
    rows = [Example("q", "4", fields={"word": "cat"})]
    return score_batch(fn, ["tac"], ["4"], RewardContext(prompts=["q"], rows=rows))[0][0]["reward"]

print(ray.get(score.remote(payload), timeout=120))
"""


def test_a_reward_file_travels_to_nodes_that_do_not_have_it(tmp_path, model_dir):
    import json
    import subprocess
    import sys
    from pathlib import Path

    from rlvr.core.imports import file_module_name

    rewards = tmp_path / "elsewhere" / "rewards.py"
    rewards.parent.mkdir()
    rewards.write_text("def backwards(completions, word, **kw):\n"
                       "    return [float(c == w[::-1]) for c, w in zip(completions, word)]\n")
    cfg = placement.absolute_paths(_cfg(model_dir, tmp_path / "run", prompt="row", **{
        "distributed.rollout_workers": 1, "rewards": {f"{rewards}:backwards": 1.0}}))
    env, payload = placement.shipped(cfg)
    name = file_module_name(rewards, "rewards")
    assert payload["rewards"] == {f"{name}:backwards": 1.0} and Path(env["py_modules"][-1]).name == f"{name}.py"
    run = subprocess.run([sys.executable, "-c", _SHIPPED_REWARD, json.dumps([env, payload, str(rewards.parent)])],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == "1.0"


def test_a_weight_broadcast_over_nodes_that_differ_in_native_bf16_agrees_on_one_dtype(tmp_path, model_dir,
                                                                                      monkeypatch):
    class Worker(roles.RolloutWorker):  # defined here: Ray ships a local class by value
        """Worker 0 on a node with native bf16 kernels, the others on nodes without (devices.cpu_has_native,
        the detection native_dtype uses, patched in this actor's own process)."""

        def __init__(self, cfg, index):
            from rlvr.core import devices

            devices.cpu_has_native = lambda dtype: index == 0
            super().__init__(cfg, index)

    class Learner(roles.Learner):
        def __init__(self, *args):
            from rlvr.core import devices

            devices.cpu_has_native = lambda dtype: True
            super().__init__(*args)

    # the old code: learner 0 and worker 0 (native bf16) sent and received a bf16 bucket, worker 1 (emulated:
    # float32) one float32 bucket of another size, and the collective failed or hung
    # Roles makes these its actors (a patched roles.Learner would make Ray ship the base class by value too)
    remote = ray.remote
    monkeypatch.setattr(ray, "remote", lambda **kw: lambda cls: remote(**kw)(
        {roles.RolloutWorker: Worker, roles.Learner: Learner}.get(cls, cls)))
    cfg = _cfg(model_dir, tmp_path / "run", generation_dtype="bfloat16", **{
        "distributed.rollout_workers": 2, "distributed.weight_sync": "broadcast", "distributed.timeout_s": 60})
    team = roles.Roles(cfg)
    try:
        team.setup_learners()
        engine_state = lambda worker: {k: v.clone() for k, v in worker.engine.named_tensors().items()}
        assert ray.get([w.__ray_call__.remote(lambda w: w.dtype) for w in team.workers]) == ["float32"] * 2
        # weights no worker holds yet, then one push
        ray.get(team.learners[0].__ray_call__.remote(lambda a: [p.data.add_(0.01) for p in a.model.parameters()]))
        team.push_weights(1)
        team.check_pushes(wait=True)
        want = ray.get(team.learners[0].weights.remote("float32"))
        for got in ray.get([w.__ray_call__.remote(engine_state) for w in team.workers]):
            assert {k: v.dtype for k, v in got.items()} == {k: torch.float32 for k in got}
            assert all(torch.equal(got[k], v) for k, v in want.items())
    finally:
        team.close()


def test_a_weight_layout_mismatch_is_named_on_both_sides_before_the_first_broadcast():
    from rlvr.distributed.parallel import agreed_dtype, check_same_layout

    assert agreed_dtype(["bfloat16", "bfloat16"]) == "bfloat16" and agreed_dtype(["bfloat16", "float32"]) == "float32"
    sent = {"node": "10.0.0.1", "tensors": [["embed.weight", [8, 4], "bfloat16"], ["inv_freq", [2], "float32"]]}
    check_same_layout(sent, {"node": "10.0.0.2", "tensors": list(reversed(sent["tensors"]))}, "a", "b")
    for held, says in (([["embed.weight", [8, 4], "float32"]], r"holds it as float32 \(8, 4\)"),
                       ([["embed.weight", [8, 5], "bfloat16"]], r"holds it as bfloat16 \(8, 5\)"),
                       ([["inv_freq", [2], "float32"]], "has no such tensor")):
        with pytest.raises(RuntimeError, match=r"learner rank 0 \(node 10.0.0.1\) sends 'embed.weight' as bfloat16 "
                                               rf"\(8, 4\), but rollout worker 1 \(node 10.0.0.2\) {says}"):
            check_same_layout(sent, {"node": "10.0.0.2", "tensors": held}, "learner rank 0", "rollout worker 1")


def _probed_estimator(tmp_path, name: str):
    """examples/custom_estimator.py as a user's file `name` outside the checkout, writing one line per import:
    (module name, file, process id) into probe.txt."""
    from pathlib import Path

    est = tmp_path / "elsewhere" / name
    est.parent.mkdir(exist_ok=True)
    probe = tmp_path / "probe.txt"
    est.write_text((Path(__file__).parents[1] / "examples" / "custom_estimator.py").read_text() +
                   f"\nimport os as _os\nwith open({str(probe)!r}, 'a') as _f:\n"
                   "    _f.write(f'{__name__} {__file__} {_os.getpid()}\\n')\n")
    return est, probe


def test_a_ray_the_caller_started_still_gets_rlvr_and_the_estimator_file(tmp_path, model_dir):
    # this module's Ray was started before rlvr (the local_ray fixture): the old start_ray returned at once and
    # nothing was shipped; each actor imported the file from the driver's path, under a per-process name
    import os

    from rlvr.core.imports import file_module_name

    assert ray.is_initialized()
    est, probe = _probed_estimator(tmp_path, "my-rloo.py")  # not a module name as it is
    cfg = _cfg(model_dir, tmp_path / "run", steps=1, **{"distributed.rollout_workers": 1, "algorithm": f"{est}:RLOO"})
    result = train_module.train_grpo(cfg)
    assert result["steps"] == 1 and result["algorithm"] == f"{est}:RLOO"
    name = file_module_name(est, "algorithm")
    imports = [line.split() for line in probe.read_text().splitlines()]
    actors = [(module, file) for module, file, pid in imports if int(pid) != os.getpid()]
    assert len(actors) >= 2  # the rollout worker and the learner, each in its own process
    for module, file in actors:  # the copy Ray unpacked for the actor, under the driver's module name
        assert file != str(est) and "py_modules_files" in file and file.endswith(f"/{name}.py") and module == name
    assert [module for module, file, pid in imports if int(pid) == os.getpid()] == [name]  # the driver, once


_TWO_NODES = """
import json, os, sys
from ray.cluster_utils import Cluster
tests, model_dir, out, algorithm = json.loads(sys.argv[1])
sys.path.insert(0, tests)
from conftest import train_cfg
from rlvr.training import rl

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
cluster.add_node(num_cpus=1)  # a worker and a learner of 1 CPU each: one on each node
try:
    cfg = train_cfg(model_dir, out, steps=1, log_rollouts_every=0, algorithm=algorithm,
                    **{"distributed.rollout_workers": 1, "distributed.address": cluster.address})
    print(json.dumps([rl.train_grpo(cfg)["steps"], os.getpid()]))
finally:
    cluster.shutdown()
"""


def test_a_run_that_joins_a_cluster_of_two_nodes_ships_rlvr_and_the_estimator_file(tmp_path, model_dir):
    import json
    import subprocess
    import sys
    from pathlib import Path

    from rlvr.core.imports import file_module_name

    # the old code shipped it as `code` (its stem: in every actor it hid the standard library's `code`), under
    # another name than the driver's module, so nothing of it pickled by reference into an actor
    est, probe = _probed_estimator(tmp_path, "code.py")
    args = [str(Path(__file__).parent), str(model_dir), str(tmp_path / "run"), f"{est}:RLOO"]
    # a Ray of its own (this module's is already up), from another directory
    run = subprocess.run([sys.executable, "-c", _TWO_NODES, json.dumps(args)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=400, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    steps, driver = json.loads(run.stdout.splitlines()[-1])
    name = file_module_name(est, "algorithm")
    imports = [line.split() for line in probe.read_text().splitlines()]
    actors = [(module, file) for module, file, pid in imports if int(pid) != driver]
    assert steps == 1 and len(actors) >= 2
    for module, file in actors:
        assert file != str(est) and "py_modules_files" in file and module == name


def test_a_shipped_file_is_imported_under_the_drivers_name_so_its_objects_pickle_into_actors(tmp_path, model_dir):
    import sys
    from pathlib import Path

    import rlvr
    from rlvr.algorithms.spec import ADVANTAGES

    est, _ = _probed_estimator(tmp_path, "my_rloo.py")
    cfg = _cfg(model_dir, tmp_path / "run", **{"distributed.rollout_workers": 1, "algorithm": f"{est}:RLOO"})
    assert cfg.estimator.advantage == "rloo"  # imported here, as the driver does
    env, payload = placement.actor_environment(cfg)  # this module's Ray was started before rlvr: per actor
    rloo = ADVANTAGES["rloo"]  # a function of the user's file: pickled by reference (its module's name)

    @ray.remote
    def remote_call(fn, payload):
        import rlvr as shipped_rlvr
        from rlvr.config import TrainConfig

        advantages, _ = fn(torch.tensor([1.0, 0.0, 1.0, 1.0]), 4, TrainConfig.model_validate(payload).estimator)
        return advantages.tolist(), shipped_rlvr.__file__, sys.modules[fn.__module__].__file__

    advantages, rlvr_file, module_file = ray.get(remote_call.options(runtime_env=env).remote(rloo, payload),
                                                 timeout=120)
    # leave-one-out: 1 - 2/3 = 1/3 for the right answers, 0 - 1 = -1 for the wrong one
    assert advantages == pytest.approx([1 / 3, -1.0, 1 / 3, 1 / 3])
    assert Path(rlvr_file).parent != Path(rlvr.__file__).parent and "py_modules_files" in rlvr_file  # rlvr too
    assert module_file != str(est) and "py_modules_files" in module_file


def test_sampled_log_probs_land_on_the_response_positions():
    from rlvr.engines.base import Completion

    labels = torch.tensor([[5, 6, 7, 1], [5, 8, 9, 0]])
    mask = torch.tensor([[False, True, True, True], [False, True, True, False]])
    completions = [Completion(0, 0, "a", [6, 7, 1], "stop", [-0.5, -1.5, -0.1]),
                   Completion(0, 1, "b", [8, 4], "length", [-2.0, -3.0])]
    out, unknown = stages.sampled_log_probs(completions, labels, mask)
    assert unknown == 1  # row 1 trains [8, 9], but [8, 4] was sampled: a guard, score_rollouts never does this
    assert out[0, 1:].tolist() == pytest.approx([-0.5, -1.5, -0.1]) and torch.isnan(out[0, 0]) and torch.isnan(out[1]).all()


def test_every_worker_generates_what_the_learner_weights_generate(tmp_path, model_dir):
    from rlvr.core.models import load_model, load_tokenizer
    from rlvr.engines.base import SamplingParams
    from rlvr.engines.hf import HFEngine
    from rlvr.tasks.datasets import load_split
    from rlvr.tasks.prompts import get_prompt
    from rlvr.tasks.records import DataOrder

    cfg = _cfg(model_dir, tmp_path / "run", **{"distributed.rollout_workers": 2})
    team = roles.Roles(cfg)
    try:
        team.setup_learners()
        team.push_weights(0)
        train = load_split(cfg, "train", None)
        tokenizer = load_tokenizer(cfg.model)
        loop = driver._SyncLoop(cfg, team, train, DataOrder(len(train), "t"), get_prompt(cfg.prompt), tokenizer,
                                 parity_reward, cfg.estimator, 0)
        loop.step()
        weights = ray.get(team.learners[0].weights.remote())
        model, _ = load_model(cfg.model)
        fresh = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(weights, strict=False)
        assert any(not torch.equal(fresh[k], v) for k, v in weights.items())  # the step changed them
        prompts = ["1+2=", "7+1=", "3+3="]
        greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
        want = [c.text for c in HFEngine(model, tokenizer).generate(prompts, greedy)]
        for w in team.workers:
            got, version = ray.get(w.generate.remote(prompts, greedy))
            assert version == 1 and [c.text for c in got] == want
    finally:
        team.close()


@ray.remote
class _Sleeper:
    def nap(self, seconds):
        import time

        time.sleep(seconds)


def test_a_dead_or_silent_role_stops_the_run_naming_it(tmp_path, model_dir):
    cfg = _cfg(model_dir, tmp_path / "run", **{"distributed.rollout_workers": 1, "distributed.timeout_s": 1})
    team = roles.Roles(cfg)
    try:
        worker = team.workers[0]
        ray.get(worker.__ray_ready__.remote())
        sleeper = _Sleeper.remote()
        team.names[sleeper] = "rollout worker 7"
        with pytest.raises(placement.RoleFailed, match=r"no answer after 1 s from rollout worker 7 \(generating"):
            team.wait([sleeper.nap.remote(30)], [sleeper], "generating step 3")
        ray.kill(worker)
        with pytest.raises(placement.RoleFailed, match=r"rollout worker 0 died \(generating step 2\).*resume=true"):
            team.wait([worker.generate.remote(["1+1="], None)], [worker], "generating step 2")
        ray.kill(sleeper)
    finally:
        team.close()


def test_distributed_config_is_checked_before_any_model_loads(tmp_path, model_dir):
    from rlvr.config import ConfigError

    with pytest.raises(ConfigError, match="needs distributed.rollout_workers"):
        _cfg(model_dir, tmp_path / "x", **{"async.max_staleness": 2})
    with pytest.raises(ConfigError, match="not a section"):
        _cfg(model_dir, tmp_path / "x", **{"distributd.learners": 2})
    with pytest.raises(ValueError, match="needs distributed.rollout_workers >= 1"):
        train_module.train_grpo(_cfg(model_dir, tmp_path / "y", **{"distributed.learners": 2}))
    assert math.isclose(_cfg(model_dir, tmp_path / "z").rollout_correction.cap, 2.0)
    # the old async.tis_cap (run directories still hold it) is the correction's cap, with a warning
    with pytest.warns(DeprecationWarning, match="rollout_correction.cap"):
        assert _cfg(model_dir, tmp_path / "z", **{"async.tis_cap": 3.0}).rollout_correction.cap == 3.0
    with pytest.raises(ConfigError, match="disagree"):
        _cfg(model_dir, tmp_path / "z", **{"async.tis_cap": 3.0, "rollout_correction.cap": 2.5})


def test_a_lora_policy_reaches_the_workers_merged(tmp_path, model_dir):
    local, dist = tmp_path / "local", tmp_path / "dist"
    # the two engines' sampling log-probs agree to the last bits only (see below), and the rollout correction
    # would train on those bits: off here, where what is compared is the weights the workers sample from
    kw = dict(lora_rank=4, learning_rate=1e-2, steps=2, eval_every=0, **{"rollout_correction.mode": "none"})
    train_module.train_grpo(_cfg(model_dir, local, **kw))
    train_module.train_grpo(_cfg(model_dir, dist, **kw, **{"distributed.rollout_workers": 1}))
    got, want = _metrics(dist), _metrics(local)
    for g, w in zip(got, want):
        if "train/token_entropy" in w:
            # the local engine decodes with a copy built from the LoRA model's config, the worker with a model
            # loaded from disk: the same weights and tokens, entropies equal to the last bits
            assert g.pop("train/token_entropy") == pytest.approx(w.pop("train/token_entropy"), rel=1e-6)
        for key in ("train/mismatch_kl", "train/mismatch_max_abs_log_ratio"):
            if key in w:
                assert g.pop(key) == pytest.approx(w.pop(key), abs=1e-6)
    assert got == want  # step 2's rollouts came from the merged step-1 adapter on both sides
    assert want[-1]["train/trained_tokens"] > 0


def test_the_curriculum_runs_in_distributed_mode_as_in_the_local_loop(tmp_path, model_dir):
    # issue 39.1: the driver draws through the same sampler and keeps its statistics in its checkpoint state
    kw = {"curriculum.enabled": True, "curriculum.min_samples": 4, "train_limit": 6, "steps": 4,
          "rollout_correction.mode": "none"}
    local, dist = tmp_path / "local", tmp_path / "dist"
    train_module.train_grpo(_cfg(model_dir, local, **kw))
    train_module.train_grpo(_cfg(model_dir, dist, **{"distributed.rollout_workers": 1, "save_every": 2, **kw}))
    assert _metrics(dist) == _metrics(local)
    assert any("curriculum/seen" in r for r in _metrics(dist))
    state = torch.load(dist / "checkpoints" / "step_000002" / "trainer_state.pt", weights_only=False)
    assert state["driver"]["curriculum"]["draws"] == 2 and state["driver"]["curriculum"]["stats"]
