"""The commands the README and the guides in docs/ show (every `rlvr ...` line of their code blocks) parse
against the CLI as it is: the command exists, its options are known, and for a command with a config the
config file loads and every `key=value` names a real field with a valid value, checked as `rlvr` checks it
before any work. Paths a guide's command produces on the way (runs/...) need not exist yet."""

import re
import shlex
from pathlib import Path

import pytest
from typer.main import get_command

from rlvr.cli import app
from rlvr.config import DemoConfig, DPOConfig, EvalConfig, SFTConfig, TrainConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONFIGS = {"eval": EvalConfig, "sft": SFTConfig, "train": TrainConfig, "dpo": DPOConfig, "demo": DemoConfig,
           "check-task": TrainConfig}


def doc_commands(path: Path) -> list[tuple[int, str]]:
    """(line, command) for every `rlvr ...` line inside the file's fenced code blocks (continuations joined,
    comments dropped)."""
    out, fenced, pending = [], False, None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            continue
        text = re.split(r"\s+#\s", line, maxsplit=1)[0].rstrip()
        if pending is not None:
            start, joined = pending
            joined += " " + text.rstrip("\\").strip()
            pending = (start, joined) if text.endswith("\\") else None
            if pending is None:
                out.append((start, joined))
        elif text.startswith("rlvr "):
            if text.endswith("\\"):
                pending = (number, text.rstrip("\\").strip())
            else:
                out.append((number, text))
    return out


CASES = [pytest.param(path, number, command, id=f"{path.relative_to(ROOT)}:{number}")
         for path in DOCS for number, command in doc_commands(path)]


def test_the_docs_show_commands():
    assert len(CASES) >= 25  # the README's and every guide's quick starts
    assert {path.name for path, *_ in (c.values for c in CASES)} >= {"README.md", "usage.md", "code_rl.md",
                                                                    "cluster.md", "gpu.md"}


def check_command(argv: list[str], where: str) -> None:
    """`rlvr argv...` parses as the CLI would parse it, and its config (or sweep) validates; run from ROOT."""
    group = get_command(app)
    name, args = argv[0], argv[1:]
    with group.make_context("rlvr", [name, "--help"], resilient_parsing=True) as ctx:
        cmd = group.get_command(ctx, name)
    assert cmd is not None, f"{where}: no command {name!r}"
    ctx = cmd.make_context(name, list(args))  # unknown options, missing values and bad types raise here
    if name in CONFIGS:
        load_config(CONFIGS[name], ctx.params.get("config"), ctx.args)  # unknown fields, bad values raise here
    elif name == "sweep":  # the sweep file, and every run's config in its grid
        from rlvr.experiments.sweep_plan import build_configs, load_sweep

        assert build_configs(load_sweep(ctx.params["config"], ctx.args))


@pytest.mark.parametrize("path, number, command", CASES)
def test_a_documented_command_parses(path, number, command, monkeypatch):
    monkeypatch.chdir(ROOT)  # the docs' paths are relative to a checkout
    check_command(shlex.split(command)[1:], f"{path.name}:{number}")


def test_the_docs_links_point_at_files_that_exist():
    broken = []
    for path in DOCS:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if "://" in target or target.startswith("#"):
                    continue
                if not (path.parent / target.split("#")[0]).exists():
                    broken.append(f"{path.relative_to(ROOT)}:{number} {target}")
    assert not broken, "\n".join(broken)


def run_script(script: Path, tmp_path: Path, stand_in: str):
    """Run a copy of an experiment script in tmp_path (its runs/ land there) with `stand_in` (bash) as rlvr."""
    import os
    import subprocess

    copy = tmp_path / "examples" / "experiments" / script.name
    copy.parent.mkdir(parents=True)
    copy.write_text(script.read_text(encoding="utf-8"), encoding="utf-8")
    rlvr = tmp_path / "rlvr"
    rlvr.write_text(f"#!/bin/bash\n{stand_in}\n")
    rlvr.chmod(0o755)
    env = {**os.environ, "RLVR": str(rlvr), "STOP": str(tmp_path / "no-stop-file")}
    return subprocess.run(["bash", str(copy)], env=env, timeout=60, check=False)  # the callers check the status


@pytest.mark.parametrize("script", sorted((ROOT / "examples" / "experiments").glob("*.sh")), ids=lambda p: p.name)
def test_an_experiment_script_runs_commands_that_parse(script, tmp_path, monkeypatch):
    """The experiment scripts, run with a stand-in for rlvr that records its arguments: every command they would
    run parses and its config validates, as the docs' commands do."""
    record = tmp_path / "commands.txt"
    run_script(script, tmp_path, f'printf "%s\\x1f" "$@" >> {record}\necho >> {record}').check_returncode()
    commands = [line.rstrip("\x1f").split("\x1f") for line in record.read_text().splitlines()]
    assert len(commands) >= 5, commands
    monkeypatch.chdir(ROOT)
    for argv in commands:
        check_command(argv, script.name)


@pytest.mark.parametrize("script", sorted((ROOT / "examples" / "experiments").glob("*.sh")), ids=lambda p: p.name)
def test_an_experiment_script_stops_at_an_interrupted_run(script, tmp_path):
    """A run that exits non-zero (130: SIGTERM or Ctrl-C after its checkpoint; or a failure) stops the script with
    that status, logs it, and is not counted as finished: the next command would otherwise train from a model that
    was never written, and a rerun would skip the unfinished one."""
    record = tmp_path / "commands.txt"
    done = run_script(script, tmp_path, f'echo "$1" >> {record}\nexit 130')
    assert done.returncode == 130
    assert len(record.read_text().splitlines()) == 1  # nothing ran after it
    logs = list((tmp_path / "runs").glob("*/log.txt"))
    assert len(logs) == 1 and logs[0].read_text().splitlines()[-1].endswith("rc=130")
    assert not list((tmp_path / "runs").glob("*/*.done"))
