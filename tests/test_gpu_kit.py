"""The GPU run kit (scripts/gpu_wheels.sh, scripts/gpu_check.sh): the wheels a lent GPU machine
gets cover what edgerl needs, they are downloaded without resolving anything, and each check
step stays short and writes into the results directory it is given.

Nothing is downloaded and no GPU is needed: the scripts' lists are parsed, and the scripts run
with a stand-in Python that records how it was called.
"""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from edgerl.config.parse import tomllib

REPO = Path(__file__).resolve().parents[1]
WHEELS_SCRIPT = REPO / "scripts" / "gpu_wheels.sh"
CHECK_SCRIPT = REPO / "scripts" / "gpu_check.sh"
# The GPU machines: CPython 3.12 on x86_64 Linux.
GPU_MACHINE = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}
MAX_STEP_S = 8 * 60


def bash_array(script: Path, name: str) -> list[str]:
    """The words of bash array ``name`` (one ``NAME=(...)`` block, comments dropped)."""
    text = script.read_text()
    found = re.search(rf"^{name}=\((.*?)\)$", text, re.MULTILINE | re.DOTALL)
    assert found, f"no {name}=(...) in {script.name}"
    words = []
    for line in found.group(1).splitlines():
        words += line.split("#", 1)[0].split()
    return words


def pinned_wheels() -> dict[str, str]:
    """The wheel list: canonical name -> pinned version."""
    pins = {}
    for word in bash_array(WHEELS_SCRIPT, "WHEELS"):
        name, sep, version = word.partition("==")
        assert sep and version, f"{word}: each wheel is pinned to one version (name==version)"
        pins[canonicalize_name(name)] = version
    return pins


def needed_on_the_gpu_machine() -> list[Requirement]:
    """What edgerl and its GPU checks import there: the runtime dependencies, the extras the
    checks use (ONNX export, NVML) and the test runner with what the test modules import."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    test = [r for r in extras["test"] if canonicalize_name(Requirement(r).name) != "edgerl"]
    # lint, the MP4 test and the browser that tests edgerl serve: not part of the GPU checks
    test_tools = {"ruff", "imageio-ffmpeg", "selenium"}
    wanted = [
        *project["dependencies"],
        *extras["export"],
        *extras["nvml"],
        *(r for r in test if canonicalize_name(Requirement(r).name) not in test_tools),
    ]
    reqs = [Requirement(r) for r in wanted]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(GPU_MACHINE)]


def test_the_gpu_wheels_cover_every_runtime_dependency_at_a_version_it_allows():
    pins = pinned_wheels()
    machine_has = {canonicalize_name(n) for n in bash_array(WHEELS_SCRIPT, "MACHINE_HAS")}
    assert {"torch", "numpy"} <= machine_has and not machine_has & set(pins)
    missing, refused = [], []
    for req in needed_on_the_gpu_machine():
        name = canonicalize_name(req.name)
        if name in machine_has:
            continue
        if name not in pins:
            missing.append(str(req))
        elif not req.specifier.contains(pins[name], prereleases=True):
            refused.append(f"{req} (pinned {pins[name]})")
    assert not missing, f"add to WHEELS in scripts/gpu_wheels.sh: {missing}"
    assert not refused, f"pinned at a version pyproject.toml refuses: {refused}"


def test_the_wheel_list_notices_a_new_runtime_dependency(monkeypatch):
    """The check above reads pyproject.toml as it is: a dependency added there without a wheel
    fails it."""
    real = tomllib.loads

    def with_one_more(text: str):
        doc = real(text)
        if "project" in doc:
            doc["project"]["dependencies"].append("pyyaml>=6")
        return doc

    monkeypatch.setattr(tomllib, "loads", with_one_more)
    with pytest.raises(AssertionError, match="pyyaml"):
        test_the_gpu_wheels_cover_every_runtime_dependency_at_a_version_it_allows()


def stand_in_python(tmp_path: Path) -> tuple[Path, Path]:
    """A ``python`` that records each call (and the failure log it is given) and succeeds;
    returns it and the file of calls."""
    calls = tmp_path / "calls.txt"
    python = tmp_path / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        f'printf "%s\\n" "FAILURE_LOG=${{EDGERL_FAILURE_LOG:-}} $*" >> "{calls}"\n'
        '[ "$1" = - ] && cat >/dev/null\n'
        "exit 0\n"
    )
    python.chmod(0o755)
    return python, calls


def run_script(script: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        cwd=env.get("CWD", str(REPO)),
    )


def test_the_wheels_are_downloaded_for_cp312_x86_64_without_resolving_into_an_ignored_folder(
    tmp_path,
):
    python, calls = stand_in_python(tmp_path)
    r = run_script(WHEELS_SCRIPT, env={"PYTHON": str(python), "CWD": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    (call,) = calls.read_text().splitlines()
    args = call.split()[1:]
    assert args[:3] == ["-m", "pip", "download"]
    assert "--no-deps" in args and "--only-binary=:all:" in args  # nothing resolved
    for flag, value in (
        ("--python-version", "3.12"),
        ("--abi", "cp312"),
        ("--dest", ".gpu-wheels"),
    ):
        assert args[args.index(flag) + 1] == value
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert platforms and all(p.startswith("manylinux") and p.endswith("x86_64") for p in platforms)
    assert sorted(a for a in args if "==" in a) == sorted(
        f"{n}=={v}" for n, v in zip(*_names_and_versions(), strict=True)
    )
    assert (tmp_path / ".gpu-wheels").is_dir()
    # A wheel left from an older list would travel and be installed too: it is removed.
    stale = tmp_path / ".gpu-wheels" / "onnx-1.17.0-cp312-cp312-manylinux2014_x86_64.whl"
    stale.write_text("")
    r = run_script(WHEELS_SCRIPT, env={"PYTHON": str(python), "CWD": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert not stale.exists()
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert "/.gpu-wheels/" in ignored and "/.gpu-site/" in ignored


def _names_and_versions() -> tuple[list[str], list[str]]:
    words = [w.partition("==") for w in bash_array(WHEELS_SCRIPT, "WHEELS")]
    return [n for n, _, _ in words], [v for _, _, v in words]


def step_limits() -> dict[str, int]:
    text = CHECK_SCRIPT.read_text()
    block = re.search(r"declare -A LIMIT=\((.*?)\)", text, re.DOTALL)
    assert block
    return {k: int(v) for k, v in re.findall(r"\[(\w+)\]=(\d+)", block.group(1))}


def test_each_gpu_check_step_has_a_limit_under_eight_minutes_and_no_test_plugin_beyond_the_wheels():
    limits = step_limits()
    steps = bash_array(CHECK_SCRIPT, "STEPS")
    assert set(steps) == set(limits) >= {"install", "doctor", "tests", "bench", "pong", "resume"}
    assert all(0 < limits[s] < MAX_STEP_S for s in steps), limits
    groups = re.search(r"declare -A STEP_GROUPS=\((.*?)\)$", CHECK_SCRIPT.read_text(), re.M)
    assert groups
    for group, members in re.findall(r'\[(\w+)\]="([^"]*)"', groups.group(1)):
        total = sum(limits[m] for m in members.split())
        assert total < 600, f"group {group}: {total} s, more than one 10-minute command"
    text = CHECK_SCRIPT.read_text()
    assert all(f"step_{s}()" in text for s in steps)
    assert not re.search(r"pytest[^\n]* -n ", text)  # pytest-xdist is in no wheel list or extra
    # Every command's own timeout fits its step's limit.
    for step in steps:
        body = re.search(rf"^step_{step}\(\) \{{\n(.*?)^\}}", text, re.MULTILINE | re.DOTALL)
        assert body, step
        for seconds in re.findall(r"timeout (?:-k \d+ )?(?:-s \w+ )?(\d+)", body.group(1)):
            assert int(seconds) <= limits[step], (step, seconds)


def packed(results: Path, step: str) -> dict[str, str]:
    """The files of ``STEP.tgz`` in the results directory: name under the step -> text."""
    with tarfile.open(results / f"{step}.tgz") as tar:
        return {
            m.name.removeprefix(f"{step}/"): tar.extractfile(m).read().decode()
            for m in tar.getmembers()
            if m.isfile()
        }


def test_a_check_step_writes_into_the_results_directory_it_is_given_packed(tmp_path):
    """Each step's files end up in one STEP.tgz beside steps.txt: a lent machine may bring
    back only a few files, and a step cut off still leaves its folder."""
    python, calls = stand_in_python(tmp_path)
    env = {
        "PYTHON": str(python),
        "GPU_WHEELS": str(tmp_path / "wheels"),
        "GPU_SITE": str(tmp_path / "site"),
    }
    results = tmp_path / "results"
    r = run_script(CHECK_SCRIPT, "tests", str(results), env=env)
    assert r.returncode == 0, r.stderr
    pytest_call = next(c for c in calls.read_text().splitlines() if "-m pytest" in c)
    assert f"FAILURE_LOG={results}/tests/gpu_failures.log " in pytest_call  # as they happen
    assert "-m gpu" in pytest_call and f"--junitxml={results}/tests/gpu_tests.xml" in pytest_call
    assert "tests/test_actor.py" in pytest_call and "tests/test_learning.py" not in pytest_call
    assert "gpu_tests.log" in packed(results, "tests")
    (line,) = (results / "steps.txt").read_text().splitlines()
    assert line.split()[:2] == ["tests", "0"]

    r = run_script(CHECK_SCRIPT, "machine", str(results), env=env)
    assert r.returncode == 0, r.stderr
    assert "machine.txt" in packed(results, "machine")
    assert sorted(p.name for p in results.iterdir()) == ["machine.tgz", "steps.txt", "tests.tgz"]
    assert [s.split()[0] for s in (results / "steps.txt").read_text().splitlines()] == [
        "tests",
        "machine",
    ]


def test_the_check_group_runs_its_steps_in_one_call_and_pong_trains_the_gpu_preset(tmp_path):
    python, calls = stand_in_python(tmp_path)
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "x-1-py3-none-any.whl").write_text("")
    env = {
        "PYTHON": str(python),
        "GPU_WHEELS": str(tmp_path / "wheels"),
        "GPU_SITE": str(tmp_path / "site"),
    }
    results = tmp_path / "results"
    r = run_script(CHECK_SCRIPT, "check", str(results), env=env)
    assert r.returncode == 0, r.stderr
    steps = [s.split()[0] for s in (results / "steps.txt").read_text().splitlines()]
    assert steps == ["install", "machine", "tests", "doctor", "bench"]
    said = calls.read_text()
    assert "-m pip install --quiet --no-index --no-deps --target" in said
    assert "doctor --deep --json" in said and "bench --json" in said

    r = run_script(CHECK_SCRIPT, "pong", str(results), env=env)
    assert r.returncode == 0, r.stderr
    said = calls.read_text()
    assert "train --preset pong-gpu" in said
    assert "export --onnx" in said and "play --run-dir" in said and "play --model" in said

    r = run_script(CHECK_SCRIPT, "limit", str(results), env=env)
    assert r.returncode == 0, r.stderr
    said = calls.read_text()
    assert "--batch-shapes 64/8,128/16,256/32" in said
    assert "limit.json" in packed(results, "limit")

    # The DQN recipe, with settings added by DQN_SETS, each as --set.
    sets = {**env, "DQN_SETS": "agent.batch_size=32 agent.train_freq=4"}
    r = run_script(CHECK_SCRIPT, "dqn", str(results), env=sets)
    assert r.returncode == 0, r.stderr
    said = calls.read_text()
    assert "train --preset pong-gpu-dqn --steps 3000000" in said
    assert "--set agent.batch_size=32 --set agent.train_freq=4" in said
    assert "dqn.log" in packed(results, "dqn")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "a step and a results directory are needed"),
        (("tests",), "a step and a results directory are needed"),
        (("everything", "out"), "unknown step everything"),
    ],
)
def test_a_wrong_gpu_check_call_is_one_sentence_and_exit_2(tmp_path, args, said):
    r = run_script(CHECK_SCRIPT, *args, env={"CWD": str(tmp_path)})
    assert r.returncode == 2 and said in r.stderr
    assert not (tmp_path / "out").exists()


def test_missing_modules_are_named_before_the_step_starts(tmp_path):
    """On a machine without the wheels, collection would fail half-way (hypothesis, ale_py):
    the step names what is missing and where it comes from, and does not start."""
    python = tmp_path / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = - ]; then cat >/dev/null; '
        'echo "gpu_check: cannot import hypothesis: run scripts/gpu_wheels.sh" >&2; exit 1; fi\n'
        "exit 0\n"
    )
    python.chmod(0o755)
    env = {"PYTHON": str(python), "GPU_WHEELS": str(tmp_path / "none"), "GPU_SITE": str(tmp_path)}
    r = run_script(CHECK_SCRIPT, "tests", str(tmp_path / "results"), env=env)
    assert r.returncode == 3
    assert "no wheels in" in r.stderr and "scripts/gpu_wheels.sh" in r.stderr
    files = packed(tmp_path / "results", "tests")
    assert "cannot import hypothesis" in files["imports.err"]
    assert "gpu_tests.log" not in files


def test_the_pong_step_fails_when_its_export_or_play_fails(tmp_path):
    """Training that ends as meant is not the whole step: a failed export or play fails it."""
    python = tmp_path / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        '[ "$1" = - ] && cat >/dev/null\n'
        'case "$*" in *" export "*) exit 1;; esac\n'
        "exit 0\n"
    )
    python.chmod(0o755)
    env = {"PYTHON": str(python), "GPU_SITE": str(tmp_path / "site"), "GPU_WHEELS": str(tmp_path)}
    results = tmp_path / "results"
    r = run_script(CHECK_SCRIPT, "pong", str(results), env=env)
    assert r.returncode == 1, r.stderr
    (line,) = (results / "steps.txt").read_text().splitlines()
    assert line.split()[:2] == ["pong", "1"]


def test_the_seeds_step_trains_each_seed_in_its_folder_and_refuses_what_cannot_fit(tmp_path):
    """The GPU issue's seeds against the clock: one run per seed of the preset, each in
    PRESET/seed-K, stopped after SEEDS_SECONDS; a count that cannot fit the step's limit is
    refused before anything runs."""
    python, calls = stand_in_python(tmp_path)
    env = {"PYTHON": str(python), "GPU_SITE": str(tmp_path / "site"), "GPU_WHEELS": str(tmp_path)}
    results = tmp_path / "results"
    r = run_script(CHECK_SCRIPT, "seeds", str(results), env={**env, "SEEDS_FROM": "3"})
    assert r.returncode == 0, r.stderr
    trains = [c for c in calls.read_text().splitlines() if " train " in c]
    assert len(trains) == 3
    for seed, call in zip((3, 4, 5), trains, strict=True):
        assert f"train --preset pong-gpu --seed {seed} --run-dir " in call
        assert f"/seeds/pong-gpu/seed-{seed} " in call and "--steps" not in call
        assert "--set eval.every_steps=250000" in call
    assert "seeds.log" in packed(results, "seeds")

    dqn = {**env, "SEEDS_PRESET": "pong-gpu-dqn", "SEEDS_COUNT": "2"}
    r = run_script(CHECK_SCRIPT, "seeds", str(results), env=dqn)
    assert r.returncode == 0, r.stderr
    trains = [c for c in calls.read_text().splitlines() if "--preset pong-gpu-dqn" in c]
    assert len(trains) == 2 and all("--steps 3000000" in c for c in trains)

    r = run_script(CHECK_SCRIPT, "seeds", str(results), env={**env, "SEEDS_COUNT": "5"})
    assert r.returncode == 2 and "do not fit the step's" in r.stderr
