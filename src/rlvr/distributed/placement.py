"""Where the Ray roles run, checked before any of them starts: what the roles ask for against what the cluster
has (`check_feasible`), starting or joining Ray (`start_ray`), what every actor gets with it: rlvr's code and the
user's files (`shipped`, `user_files`), paths made absolute on the driver, and the checks a role runs on its
node: it must see the driver's run directory (`check_shared_run_dir`) and the model (`check_model_here`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rlvr.config import TrainConfig
from rlvr.core.imports import file_module_name


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
    """`out`, and `model` / `teacher` / a file estimator / reward files when they name local paths, made absolute
    on the driver: Ray actors do not start in the driver's directory."""
    update = {"out": str(Path(cfg.out).resolve())}
    for field in ("model", "teacher"):
        value = getattr(cfg, field, None)
        if value and Path(value).exists():
            update[field] = str(Path(value).resolve())
    path, sep, attr = cfg.algorithm.rpartition(":")
    if sep and path.endswith(".py") and Path(path).exists():
        update["algorithm"] = f"{Path(path).resolve()}:{attr}"
    if cfg.rewards:  # a user's reward files (validation on the workers grades with them)
        update["rewards"] = {(f"{Path(p).resolve()}:{a}" if _is_file_ref(k) else k): w
                             for k, w in cfg.rewards.items() for p, _, a in [k.rpartition(":")]}
    return cfg.model_copy(update=update)


def user_files(cfg: TrainConfig) -> list[tuple[str, str]]:
    """(field, reference) for each `path/to/file.py:attr` in `cfg` that the actors import, with the `field`
    rlvr.core.imports.import_target is called with for it: the files `shipped` sends. A new kind of user file
    (a reward function's: `rewards={file.py:fn: w}`) adds its references here."""
    refs = [("algorithm", cfg.algorithm)] + [("rewards", name) for name in cfg.rewards or {}]
    return [(field, ref) for field, ref in refs if _is_file_ref(ref)]


def _is_file_ref(ref: str) -> bool:
    path, sep, _ = ref.rpartition(":")
    return bool(sep) and path.endswith(".py") and Path(path).is_file()


def shipped(cfg: TrainConfig) -> tuple[dict, dict]:
    """(runtime_env, payload): what every Ray actor is created with, wherever Ray came from (started here,
    joined with distributed.address, or already started by the caller: a runtime_env given to ray.init would
    miss the last). Nodes other than the driver's have neither this checkout nor the user's files, so rlvr's
    code and each file of `user_files` travel with the actors (Ray's py_modules, uploaded once per content);
    a file travels as `<name>.py`, with `name` the module this process imported it as
    (rlvr.core.imports.file_module_name), and the payload (the config as JSON) names it `name:attr`: the actors
    import it under the driver's name, so an object from it pickles by reference between them."""
    import rlvr

    modules, renamed = [str(Path(rlvr.__file__).parent)], {}
    for field, ref in user_files(cfg):
        path, _, attr = ref.rpartition(":")
        name = file_module_name(path, field)
        copy = Path(cfg.out) / ".rlvr-shipped" / f"{name}.py"  # Ray keeps a single file's name
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy)
        modules.append(str(copy))
        renamed[ref] = f"{name}:{attr}"
    payload = _rename(cfg.model_dump(mode="json", by_alias=True), renamed)
    return {"py_modules": modules, "env_vars": {"TOKENIZERS_PARALLELISM": "false"}}, payload


def _rename(value, renamed: dict[str, str]):
    """`value` (JSON) with every string in `renamed`, as a value or a key, replaced."""
    if isinstance(value, str):
        return renamed.get(value, value)
    if isinstance(value, list):
        return [_rename(v, renamed) for v in value]
    if isinstance(value, dict):
        return {renamed.get(k, k): _rename(v, renamed) for k, v in value.items()}
    return value


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


_STARTED = "RLVR_RAY"  # in the job's env_vars when start_ray started or joined it: "local" or "shipped"


def start_ray(cfg: TrainConfig) -> bool:
    """Join `distributed.address` with rlvr's code and the user's files (`shipped`), or start a local Ray with
    enough CPUs for every role; True if started here. False: the caller had started Ray, and `actor_environment`
    ships them with each actor instead."""
    import ray

    d = cfg.distributed
    if ray.is_initialized():
        return False
    if d.address:
        env = shipped(cfg)[0]
        ray.init(address=d.address, log_to_driver=True,
                 runtime_env={**env, "env_vars": {**env["env_vars"], _STARTED: "shipped"}})
        return True
    wanted = d.rollout_workers * d.rollout_num_cpus + d.learners * d.learner_num_cpus
    # logical CPUs: in synchronous mode the roles take turns, so a 2-core machine can host 2 workers + 2 learners
    ray.init(num_cpus=max(os.cpu_count() or 1, int(wanted + 0.999)), include_dashboard=False, log_to_driver=True,
             runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", _STARTED: "local"}})
    return True


def actor_environment(cfg: TrainConfig) -> tuple[dict | None, dict]:
    """(runtime_env for each actor, or None for the job's; the config payload each actor gets). A local Ray
    started by start_ray runs the actors from this checkout, and they import a user's file from its path; one
    it joined already carries `shipped` for the whole job; one the caller started (ray.init before rlvr) took no
    runtime_env from rlvr, so rlvr's code and the user's files travel with each actor."""
    import ray

    job = ray.get_runtime_context().runtime_env
    started = (job.get("env_vars") or {}).get(_STARTED)
    if started == "local":
        return None, cfg.model_dump(mode="json", by_alias=True)
    env, payload = shipped(cfg)
    if started == "shipped":
        return None, payload
    # an actor's py_modules replace the job's: keep the caller's own
    env["py_modules"] = [*(job.get("py_modules") or []), *_uploaded(env["py_modules"])]
    return env, payload


def _uploaded(paths: list[str]) -> list[str]:
    """Local directories and .py files as URIs in Ray's store: an actor's runtime_env takes only URIs (Ray
    uploads local paths for ray.init's alone), so this calls the function ray.init uses (internal to Ray)."""
    import inspect
    import tempfile

    try:
        from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    except ImportError:
        raise RoleFailed("Ray was started before rlvr (ray.init) and this Ray version has no upload rlvr can use "
                         "to send its code and your files to each actor: let rlvr start Ray (no ray.init; "
                         "distributed.address=auto joins a cluster)") from None
    gitignore = ({"include_gitignore": True} if "include_gitignore" in
                 inspect.signature(upload_py_modules_if_needed).parameters else {})
    with tempfile.TemporaryDirectory() as scratch:
        return upload_py_modules_if_needed({"py_modules": list(paths)}, scratch_dir=scratch, **gitignore)["py_modules"]
