"""Periodic greedy evaluation on real CartPole runs: eval.csv, the progress line, status, plot."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

from edgerl.config import Config, EnvConfig, EvalConfig, build_layers, resolve
from edgerl.envs import probe
from edgerl.files.checkpoint import Checkpoint, load
from edgerl.learners.nets import build_q_network
from edgerl.policies import newest_checkpoint
from edgerl.report.evaluate import EVAL_COLUMNS, eval_period, evaluate

from .conftest import edgerl_cmd

SHORT = ["--env", "CartPole-v1", "--set", "env.num_envs=2", "--set", "train.log_every_s=0.2"]


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def train(cli, run: Path, steps: int, *sets: str):
    args = [a for s in sets for a in ("--set", s)]
    r = cli("train", *SHORT, "--steps", steps, "--run-dir", run, *args)
    assert r.code == 0, r.err[-3000:]
    return r


def skipped_steps(err: str) -> list[int]:
    """The steps whose evaluation the log says was skipped (the one before still ran)."""
    return [
        int(line.split("evaluation at step ")[1].split(" ")[0].replace(",", ""))
        for line in err.splitlines()
        if "skipped: the one of step" in line
    ]


def test_eval_csv_has_a_row_per_evaluation_and_a_resume_appends(cli, tmp_path, monkeypatch):
    run = tmp_path / "runs" / "CartPole-v1"
    r = train(cli, run, 2000, "eval.every_steps=500", "eval.episodes=2")
    first = rows(run / "eval.csv")
    assert list(first[0]) == EVAL_COLUMNS
    # every 500 steps an evaluation, unless the one before still ran (then the log says so);
    # the last one, of the last step, is waited for
    done = [int(row["step"]) for row in first]
    assert sorted(done + skipped_steps(r.err)) == [500, 1000, 1500, 2000], r.err[-3000:]
    assert done[-1] == 2000
    for row in first:
        assert int(row["episodes"]) == 2 and int(row["cut"]) == 0
        low, mean, high = (float(row[k]) for k in ("return_min", "return_mean", "return_max"))
        assert low <= mean <= high
        assert float(row["length_mean"]) == mean  # CartPole pays 1 per step
        assert float(row["eval_s"]) > 0
        assert row["return_5min"] == ""  # no human reference: not an Atari game
    walls = [float(row["wall_s"]) for row in first]
    assert walls == sorted(walls)
    last = float(first[-1]["return_mean"])
    assert f"evaluation at step 2,000: mean return {last:.1f}" in r.err
    assert "| eval " in r.err  # the progress line
    status = json.loads((run / "status.json").read_text())
    assert status["eval_step"] == 2000 and status["eval_return"] == pytest.approx(last)
    s = cli("status", "--run-dir", run)
    assert f"evaluation at step 2,000: mean return {last:.2f}" in s.out

    # As an edgerl before the return_5min column wrote it: a resume keeps the file's columns.
    older = EVAL_COLUMNS[:-1]
    lines = (run / "eval.csv").read_text().splitlines()
    (run / "eval.csv").write_text("".join(line.rsplit(",", 1)[0] + "\n" for line in lines))
    first = [{k: row[k] for k in older} for row in first]
    train(cli, run, 3000, "eval.every_steps=500", "eval.episodes=2")  # resumes the run
    text = (run / "eval.csv").read_text()
    assert text.count(",".join(older)) == 1 and "return_5min" not in text
    both = rows(run / "eval.csv")
    assert all(list(row) == older for row in both)  # whole rows: no cell without a column
    assert both[: len(first)] == first
    assert int(both[-1]["step"]) == 3000
    assert all(int(row["step"]) > 2000 for row in both[len(first) :])
    # Run again on the finished run (`make run` twice): nothing to do, and its status keeps the
    # run's evaluation and checkpoint (they were written as null, and /metrics dropped them).
    train(cli, run, 3000, "eval.every_steps=500", "eval.episodes=2")
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "finished" and status["eval_step"] == 3000
    assert status["eval_return"] == pytest.approx(float(both[-1]["return_mean"]))
    assert status["checkpoint"] and Path(status["checkpoint"]).name.endswith("step0000003000.ckpt")
    assert "evaluation at step 3,000" in cli("status", "--run-dir", run).out

    monkeypatch.setenv("COLUMNS", "70")
    monkeypatch.setenv("LINES", "20")
    p = cli("plot", "--run-dir", run, "--terminal")
    assert p.code == 0, p.err
    lines = p.out.splitlines()
    assert lines[0] == "training and evaluation return against env steps"
    assert sum(line.count("E") for line in lines[1:-3]) >= 2  # the evaluations, over the curve
    assert "* CartPole-v1 (E: evaluation)" in p.out
    assert f"eval {float(both[-1]['return_mean']):.1f} at step 3,000" in p.out


def test_evaluation_does_not_change_training_and_off_writes_nothing(cli, tmp_path):
    """Sync mode with a fixed seed: the same updates and weights with evaluations as without."""
    common = ["agent.learning_starts=200", "env.seed=3"]
    train(cli, tmp_path / "on", 1200, *common, "eval.every_steps=200", "eval.episodes=3")
    train(cli, tmp_path / "off", 1200, *common)  # auto: a run this short is not evaluated
    assert len(rows(tmp_path / "on" / "eval.csv")) >= 1
    assert not (tmp_path / "off" / "eval.csv").exists()
    on, off = (load(newest_checkpoint(tmp_path / name)) for name in ("on", "off"))
    assert on.learner["updates"] == off.learner["updates"] == (1200 - 200) // 2
    assert on.episodes == off.episodes
    for name, tensor in off.learner["q"].items():
        assert torch.equal(on.learner["q"][name], tensor), name
    assert on.rng is not None and off.rng is not None
    assert torch.equal(on.rng["torch"], off.rng["torch"])


def always_left() -> Checkpoint:
    """A CartPole policy snapshot whose network picks action 0 (push left) whatever it sees."""
    spec = probe("CartPole-v1")
    cfg = Config()
    cfg.env.id, cfg.agent.hidden = "CartPole-v1", (8,)
    net = build_q_network(spec, cfg.agent.hidden)
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.net[-1].bias[0] = 1.0
    return Checkpoint(
        kind="dqn",
        step=0,
        env=spec.to_dict(),
        config=cfg.to_dict(),
        learner={"q": net.state_dict()},
    )


def test_an_evaluation_plays_greedily_with_eval_epsilon_random_actions():
    snapshot = always_left()
    greedy = evaluate(snapshot, EvalConfig(episodes=10, epsilon=0.0), seed=1)
    # pushing left all the time drops the pole within a dozen steps, every time
    assert len(greedy.returns) == 10 and max(greedy.lengths) <= 12
    assert greedy.returns == [float(n) for n in greedy.lengths]
    randomly = evaluate(snapshot, EvalConfig(episodes=10, epsilon=1.0), seed=1)
    assert max(randomly.lengths) > 12  # random pushes keep it up longer at times
    same = evaluate(snapshot, EvalConfig(episodes=10, epsilon=1.0), seed=1)
    assert same.lengths == randomly.lengths  # seeded


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_an_evaluation_on_the_gpu_plays_the_episodes_the_cpu_does():
    """A GPU run evaluates on its GPU (the CPU's cores are the emulators'): same seed, same
    policy, the same episodes as on the CPU."""
    settings = EvalConfig(episodes=4, epsilon=0.5)
    on_gpu = evaluate(always_left(), settings, seed=5, device="cuda")
    on_cpu = evaluate(always_left(), settings, seed=5, device="cpu")
    assert on_gpu.lengths == on_cpu.lengths and len(on_gpu.returns) == 4


@pytest.fixture
def batches(monkeypatch) -> list[int]:
    """The number of observations of each forward pass a TorchPolicy makes to act."""
    from edgerl.policies.torch import TorchPolicy

    sizes: list[int] = []
    original = TorchPolicy.act

    def counting(self, obs):
        sizes.append(len(obs))
        return original(self, obs)

    monkeypatch.setattr(TorchPolicy, "act", counting)
    return sizes


def test_an_evaluation_plays_its_episodes_at_once_one_batched_forward_pass_a_step(batches):
    """Ten episodes on ten environments: every forward pass holds ten observations, and there
    are as many passes as the longest episode has steps (not the sum of all ten)."""
    result = evaluate(always_left(), EvalConfig(episodes=10, epsilon=0.0), seed=3)
    assert len(result.returns) == 10 and set(batches) == {10}
    assert len(batches) == max(result.lengths) < sum(result.lengths) == result.steps


def test_many_episodes_are_played_in_waves_of_a_few_environments(batches):
    """Twenty episodes: a wave of 16 environments, then one of 4 counted on the same 16 (each
    environment's first episode, whichever ends first), never 20 environments at once."""
    from edgerl.play import MAX_TOGETHER

    result = evaluate(always_left(), EvalConfig(episodes=20, epsilon=0.0), seed=3)
    assert MAX_TOGETHER == 16 and set(batches) == {16}
    assert len(result.returns) == len(result.lengths) == 20 and max(result.lengths) <= 12
    assert result.steps == sum(result.lengths)


def test_an_evaluation_says_how_many_episodes_ended_and_steps_were_played_as_it_goes():
    seen: list[tuple[int, int]] = []
    settings = EvalConfig(episodes=3, epsilon=0.0)
    result = evaluate(always_left(), settings, seed=3, progress=lambda e, s: seen.append((e, s)))
    assert seen[-1] == (3, result.steps) and len(seen) > 3
    assert [e for e, _ in seen] == sorted(e for e, _ in seen)  # episodes ended only grow
    assert [s for _, s in seen] == sorted(s for _, s in seen)


def test_a_long_evaluation_is_said_in_the_log_as_it_goes(cli, tmp_path, monkeypatch):
    """Breakout's first evaluation ran 4.5 minutes in silence (issue 59): every
    PROGRESS_EVERY_S (here: each step) the log says how far it is."""
    from edgerl.report import evaluate as evaluate_module

    monkeypatch.setattr(evaluate_module, "PROGRESS_EVERY_S", 0.0)
    r = train(cli, tmp_path / "run", 600, "eval.every_steps=500", "eval.episodes=2")
    assert "evaluating step 500: 0 of 2 episodes ended, " in r.err
    assert "evaluating step 500: 2 of 2 episodes ended, " in r.err


def test_an_evaluation_stopped_while_recording_leaves_no_recording(tmp_path):
    asked = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) > 2  # two steps in: a stop request from training

    gif = tmp_path / "eval-step-7.gif"
    result = evaluate(always_left(), EvalConfig(episodes=3), seed=0, stop=stop, record=gif)
    assert result.recording is None and len(result.returns) < 3
    assert list(tmp_path.iterdir()) == []  # nothing under its name, no partial file either
    done = evaluate(always_left(), EvalConfig(episodes=1), seed=0, record=gif)
    assert done.recording is not None and gif.exists()  # not stopped: kept


def test_an_episode_longer_than_the_cap_is_cut_and_counted():
    result = evaluate(always_left(), EvalConfig(episodes=3, max_episode_steps=4), seed=0)
    assert result.lengths == [4, 4, 4] and result.cut == 3


def noop_pong() -> Checkpoint:
    """A Pong policy that never moves: it loses 21-0 in about 760 steps."""
    spec = probe("ALE/Pong-v5")
    cfg = Config()
    cfg.env.id = "ALE/Pong-v5"
    net = build_q_network(spec, cfg.agent.hidden)
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()  # every action's value 0: argmax, NOOP
    learner = {"q": net.state_dict()}
    return Checkpoint(kind="dqn", step=0, env=spec.to_dict(), config=cfg.to_dict(), learner=learner)


def test_an_atari_evaluation_also_scores_each_episodes_first_5_minutes(monkeypatch, tmp_path):
    """The human reference played 5 minutes (18,000 frames): an evaluation sums each episode's
    first 18,000 frames apart (here 800: 200 steps, so a lost Pong game is longer), the recorded
    episode too, and says both when they differ."""
    import edgerl.envs
    from edgerl.report.evaluate import Evaluation

    assert edgerl.envs.reference_steps(EnvConfig(id="CartPole-v1")) is None  # no human reference
    full = evaluate(noop_pong(), EvalConfig(episodes=2), seed=0)
    assert full.returns == [-21.0, -21.0] and full.returns_within == full.returns  # 760 < 4,500
    monkeypatch.setattr(edgerl.envs, "REFERENCE_FRAMES", 800)
    short = evaluate(noop_pong(), EvalConfig(episodes=2), seed=0)
    assert short.returns == full.returns and len(short.returns_within) == 2
    assert all(-21 < r < 0 for r in short.returns_within), short.returns_within
    recorded = evaluate(noop_pong(), EvalConfig(episodes=2), 0, record=tmp_path / "e.gif")
    assert recorded.returns_within == short.returns_within  # the same seeds, the same points
    ev = Evaluation(7, 1.0, tuple(short.returns), tuple(short.lengths), 0, 1.0,
                    tuple(short.returns_within))  # fmt: skip
    within = sum(short.returns_within) / 2
    assert ev.cells()["return_5min"] == f"{within:.6g}"
    assert f"; {within:.1f} within 5 minutes each" in ev.describe("ALE/Pong-v5")


def test_auto_evaluates_runs_of_50000_steps_or_more_twenty_times():
    def period(*sets: str) -> int:
        return eval_period(resolve(build_layers(None, list(sets), use_system=False)))

    assert period("train.steps=49999") == 0
    assert period("train.steps=100000") == 5_000
    assert period("train.steps=60000") == 3_000
    assert period("train.steps=10000000") == 500_000
    assert period("train.steps=1234567") == 61_000
    assert period("train.steps=10000000", "eval.every_steps=0") == 0
    assert period("train.steps=1000", "eval.every_steps=250") == 250


def test_the_last_evaluation_is_kept_however_long_it_plays(cli, tmp_path, monkeypatch):
    """A HalfCheetah run's evaluation of its last step was cut by a 30 s cap at the run's end
    on a busy core (it needed 50 s): the end waits for it."""
    from edgerl.report import evaluate as evaluate_module

    real = evaluate_module.play_together

    def slow(policy, options):
        time.sleep(2.0)  # longer than the old cap, shortened here to 0.5 s
        return real(policy, options)

    monkeypatch.setattr(evaluate_module, "play_together", slow)
    monkeypatch.setattr(evaluate_module, "FINAL_WAIT_S", 0.5, raising=False)
    run = tmp_path / "run"
    r = train(cli, run, 400, "eval.every_steps=400", "eval.episodes=1")
    assert r.code == 0, r.err[-3000:]
    assert "waiting for the evaluation of step 400 (a stop ends it)" in r.err
    assert "stopped with training" not in r.err
    with (run / "eval.csv").open(newline="") as f:
        assert [row["step"] for row in csv.DictReader(f)] == ["400"]


def test_an_evaluation_that_fails_is_one_log_line_and_training_goes_on(cli, tmp_path, monkeypatch):
    import edgerl.report.evaluate

    def broken(*args, **kwargs):
        raise RuntimeError("no emulator for you")

    monkeypatch.setattr(edgerl.report.evaluate, "play_together", broken)
    run = tmp_path / "run"
    r = train(cli, run, 600, "eval.every_steps=200")
    failed = "evaluation at step 200 failed (RuntimeError: no emulator for you); training goes on"
    assert failed in r.err
    assert "Traceback" not in r.err
    assert "step 600/600" in r.err
    assert not (run / "eval.csv").exists()


def test_a_stop_during_an_evaluation_ends_it_and_training_promptly(tmp_path):
    run = tmp_path / "run"
    args = ["train", *SHORT, "--steps", "10M", "--run-dir", str(run)]
    # the first evaluation would play for hours: the next ones are skipped meanwhile
    sets = ["eval.every_steps=200", "eval.episodes=1000000", "eval.max_episode_steps=1000000"]
    args += [a for s in sets for a in ("--set", s)]
    proc = subprocess.Popen(edgerl_cmd(*args), stderr=subprocess.PIPE, text=True)
    killer = threading.Timer(300, proc.kill)  # a hung run must not hang the test suite
    killer.start()
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if "skipped: the one of step 200 is still running" in line:
                break
        # status.json and edgerl status say how far the evaluation is (issue 59)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            doc = json.loads((run / "status.json").read_text())
            if doc.get("evaluating_step") == 200:
                break
            time.sleep(0.5)
        assert doc["evaluating_episodes"] == 1_000_000 and doc["evaluating_done"] >= 0, doc
        described = subprocess.run(
            edgerl_cmd("status", "--run-dir", str(run)), capture_output=True, text=True, timeout=120
        ).stdout
        assert "evaluating step 200: " in described and " of 1,000,000 episodes ended" in described
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=120)
    finally:
        killer.cancel()
        if proc.poll() is None:  # a failed assert above: the trainer is stopped by its pid
            proc.kill()
            proc.communicate()
    err = "".join(lines) + (rest or "")
    assert proc.returncode == 130, err[-3000:]
    assert "evaluation at step 200 stopped with training" in err
    assert "did not stop" not in err
    assert not (run / "eval.csv").exists()  # an evaluation cut short writes no row
    assert list((run / "checkpoints").glob("*.ckpt"))


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "eval.every_steps=-2",
            "eval.every_steps must be between -1 and 1,000,000,000,000, got -2",
        ),
        ("eval.episodes=0", "eval.episodes must be between 1 and 1,000,000, got 0"),
        ("eval.epsilon=1.5", "eval.epsilon must be between 0.0 and 1.0, got 1.5"),
    ],
)
def test_eval_settings_out_of_range_are_one_sentence(cli, setting, message):
    r = cli("config", "--set", setting)
    assert r.code == 2 and message in r.err and "Traceback" not in r.err


def test_eval_record_keeps_the_first_episode_of_every_nth_evaluation_as_a_gif(cli, tmp_path):
    from PIL import Image

    run = tmp_path / "runs" / "CartPole-v1"
    r = train(cli, run, 2000, "eval.every_steps=500", "eval.episodes=2", "eval.record=2")
    done = [int(row["step"]) for row in rows(run / "eval.csv")]
    recorded = sorted(p.name for p in (run / "recordings").iterdir())
    assert recorded == [f"eval-step-{step}.gif" for step in done[1::2]], r.err[-3000:]
    for name in recorded:
        assert f"recorded the evaluation of step {int(name[10:-4]):,}" in r.err
        with Image.open(run / "recordings" / name) as gif:
            assert gif.n_frames >= 2  # one after the reset, one per step
            gif.seek(gif.n_frames - 1)
            rgb = gif.convert("RGB")
            assert rgb.size[0] == 600  # CartPole's own colour render, not the agent's vector
            assert len(rgb.getcolors(maxcolors=1 << 16) or []) > 2


def test_eval_record_without_pillow_says_so_once_and_evaluates_on(cli, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "PIL", None)  # as where the record extra is not installed
    run = tmp_path / "runs" / "CartPole-v1"
    r = train(cli, run, 1000, "eval.every_steps=500", "eval.episodes=1", "eval.record=1")
    assert r.err.count("evaluations are not recorded from now on") == 1, r.err[-3000:]
    assert "pip install 'edgerl[record]'" in r.err
    assert [int(row["step"]) for row in rows(run / "eval.csv")][-1] == 1000
    assert not any((run / "recordings").iterdir())


def test_an_episode_cut_by_the_games_own_frame_cap_is_counted_as_cut():
    """ALE's frame cap (env.max_episode_frames: the GA's 20,000, the 108,000 of the protocol)
    ends an episode as truncated, not terminated: the cut column counts it, as it counts
    eval.max_episode_steps' cuts."""
    spec = probe("ALE/Pong-v5")
    cfg = Config()
    cfg.env.id, cfg.env.max_episode_frames = "ALE/Pong-v5", 400  # 100 agent steps of 4 frames
    net = build_q_network(spec, cfg.agent.hidden)
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()  # NOOP: a game lost 21-0 takes about 760 steps, far past the cap
    snapshot = Checkpoint(
        kind="dqn",
        step=0,
        env=spec.to_dict(),
        config=cfg.to_dict(),
        learner={"q": net.state_dict()},
    )
    result = evaluate(snapshot, EvalConfig(episodes=2), seed=0)
    assert result.lengths == [100, 100] and result.cut == 2
    from edgerl.play import PlayOptions, play
    from edgerl.policies.torch import TorchPolicy

    alone = play(TorchPolicy(snapshot, "cpu"), PlayOptions(episodes=1), [])  # `edgerl play`
    assert alone.lengths == [100] and alone.cut == 1
