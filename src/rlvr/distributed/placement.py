"""Where the Ray roles run, checked before any of them starts: what the roles ask for against what the cluster
has (`check_feasible`), starting or joining Ray with rlvr's code shipped (`start_ray`, `shipped`), paths made
absolute on the driver, and the checks a role runs on its node: it must see the driver's run directory
(`check_shared_run_dir`) and the model (`check_model_here`).
"""

from __future__ import annotations

import os
from pathlib import Path

from rlvr.config import TrainConfig


class RoleFailed(RuntimeError):
    """A Ray role died, raised, or did not answer in time; the message names it and the last checkpoint."""


_TOKEN = ".rlvr-driver"


def write_run_token(run_dir: Path) -> str:
    """A fresh random token in the run directory, which every learner must read back (check_shared_run_dir)."""
    token = os.urandom(8).hex()
    (run_dir / _TOKEN).write_text(token)
    return token


def check_shared_run_dir(run_dir: Path, token: str, who: str) -> None:
    """Learner 0 writes checkpoints and the final model into `out` and the driver reads them back, and every
    learner resumes from the `latest` checkpoint there: on a cluster without a shared `out`, each node would
    see its own disk. Stop before loading anything when this process does not see the driver's token."""
    if not token:
        return
    try:
        seen = (run_dir / _TOKEN).read_text()
    except OSError:
        seen = None
    if seen != token:
        import ray

        raise RuntimeError(f"{who} on node {ray.util.get_node_ip_address()} does not see the run directory the driver "
                           f"wrote ({run_dir}/{_TOKEN} is {'missing' if seen is None else 'from another run'}):"
                           " `out` must be on a filesystem every node shares")


def check_model_here(cfg: TrainConfig, who: str) -> None:
    """A model the driver found as a local directory (absolute_paths made it absolute) must be on this node
    too: nothing copies gigabytes of weights between nodes, so say so before transformers fails obscurely."""
    for field in ("model", "teacher"):
        value = getattr(cfg, field, None)
        if value and Path(value).is_absolute() and not Path(value).exists():
            import ray

            raise RuntimeError(f"{who} on node {ray.util.get_node_ip_address()}: {field}={value} does not exist "
                               "there; put it on a filesystem every node shares (or name a hub model)")


def absolute_paths(cfg: TrainConfig) -> TrainConfig:
    """`out`, and `model` / `teacher` / a file estimator when they name local paths, made absolute on the driver:
    Ray actors do not start in the driver's directory."""
    update = {"out": str(Path(cfg.out).resolve())}
    for field in ("model", "teacher"):
        value = getattr(cfg, field, None)
        if value and Path(value).exists():
            update[field] = str(Path(value).resolve())
    path, sep, attr = cfg.algorithm.rpartition(":")
    if sep and path.endswith(".py") and Path(path).exists():
        update["algorithm"] = f"{Path(path).resolve()}:{attr}"
    return cfg.model_copy(update=update)


def shipped(cfg: TrainConfig) -> tuple[dict, TrainConfig]:
    """(runtime_env for ray.init, the config the actors get) for a cluster this process joins: nodes other than
    the driver's have neither this checkout nor a user's estimator file, so rlvr's code and the file travel with
    the job (Ray's py_modules, uploaded once), and the actors import the file as the module it ships as."""
    import rlvr

    modules = [str(Path(rlvr.__file__).parent)]
    path, sep, attr = cfg.algorithm.rpartition(":")
    if sep and path.endswith(".py"):
        modules.append(path)
        cfg = cfg.model_copy(update={"algorithm": f"{Path(path).stem}:{attr}"})
    return {"py_modules": modules, "env_vars": {"TOKENIZERS_PARALLELISM": "false"}}, cfg


def check_feasible(cfg: TrainConfig, nodes: list[dict]) -> None:
    """Fail at once, saying what was asked and what the cluster has, when Ray could never place the roles
    (it would otherwise wait for resources that will not come). `nodes`: ray.nodes()."""
    d = cfg.distributed
    alive = [n["Resources"] for n in nodes if n.get("Alive", True)]
    have = {k: sum(r.get(k, 0) for r in alive) for k in ("CPU", "GPU")}
    roles = [("learner", d.learners, {"CPU": d.learner_num_cpus, "GPU": d.learner_num_gpus}),
             ("rollout worker", d.rollout_workers, {"CPU": d.rollout_num_cpus, "GPU": d.rollout_num_gpus})]
    asked = {k: sum(n * r[k] for _, n, r in roles) for k in ("CPU", "GPU")}
    problems = [f"{k}: asked for {asked[k]:g}, the cluster has {have[k]:g}" for k in asked if asked[k] > have[k] + 1e-9]
    for name, n, req in roles:  # every role must fit on some node
        if n and not any(all(r.get(k, 0) + 1e-9 >= v for k, v in req.items()) for r in alive):
            problems.append(f"no node has a {name}'s {req['CPU']:g} CPU + {req['GPU']:g} GPU")
    if problems:
        raise RoleFailed(f"infeasible: {'; '.join(problems)} ({d.learners} learners x {d.learner_num_cpus:g} CPU + "
                         f"{d.learner_num_gpus:g} GPU, {d.rollout_workers} rollout workers x {d.rollout_num_cpus:g} CPU + "
                         f"{d.rollout_num_gpus:g} GPU; distributed.*_num_cpus / *_num_gpus)")


def start_ray(cfg: TrainConfig) -> bool:
    """Join `distributed.address` or start a local Ray with enough CPUs for every role; True if started here."""
    import ray

    d = cfg.distributed
    if ray.is_initialized():
        return False
    if d.address:  # other nodes get rlvr's code and a file estimator from here (shipped)
        ray.init(address=d.address, log_to_driver=True, runtime_env=shipped(cfg)[0])
        return True
    wanted = d.rollout_workers * d.rollout_num_cpus + d.learners * d.learner_num_cpus
    # logical CPUs: in synchronous mode the roles take turns, so a 2-core machine can host 2 workers + 2 learners
    ray.init(num_cpus=max(os.cpu_count() or 1, int(wanted + 0.999)), include_dashboard=False, log_to_driver=True,
             runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    return True
