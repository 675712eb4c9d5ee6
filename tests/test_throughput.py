"""Pipelines, the fixed-shape update, mixed precision choices, autotune and `edgerl bench`."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from edgerl.autotune import ActorMeasurement, choose, predict
from edgerl.config import AgentConfig, PerfConfig, build_layers, resolve
from edgerl.device import resolve_amp, resolve_cuda_graphs
from edgerl.dqn import DQN
from edgerl.errors import ConfigError
from edgerl.nets import MLP, NatureCNN
from edgerl.pipeline import resolve_pipeline
from edgerl.replay import Batch
from edgerl.train import Trainer

CUDA = torch.cuda.is_available()
CPU, GPU = torch.device("cpu"), torch.device("cuda")


def pong_config(tmp_path, *sets: str, steps: int = 1600):
    return resolve(
        build_layers(
            None,
            [
                "agent.learning_starts=400",
                "agent.batch_size=8",
                "agent.train_freq=4",
                "replay.capacity=4000",
                "hw.monitor=false",
                "display.enabled=false",
                *sets,
            ],
            {"env.id": "ALE/Pong-v5", "train.steps": steps, "train.run_dir": str(tmp_path / "run")},
            use_system=False,
        )
    )


@pytest.mark.parametrize("num_envs", [4, 3])
def test_async_replay_ratio_is_exact_and_lag_bounded(tmp_path, num_envs):
    cfg = pong_config(
        tmp_path,
        "perf.pipeline=async",
        f"env.num_envs={num_envs}",
        "perf.max_policy_lag=2",
        "perf.max_ahead=3",
    )
    with Trainer(cfg, quiet=True) as trainer:
        result = trainer.run()
        learning = trainer.learning
        assert learning.mode == "async"
        assert trainer.learner.updates == (result.step - 400) // 4  # exact, whatever num_envs
        assert 0 < learning.max_ahead_seen <= 3  # acting ran ahead, but never further
        assert learning.max_lag_seen <= 2  # the actor's weights lagged at most 2 updates
        assert result.step >= 1600 and result.step - 1600 < num_envs


def test_sync_mode_is_deterministic(tmp_path):
    from edgerl.checkpoint import load
    from edgerl.play import newest_checkpoint

    weights = []
    for i in range(2):
        cfg = pong_config(tmp_path / str(i), "perf.pipeline=sync", "env.num_envs=2", steps=800)
        with Trainer(cfg, quiet=True) as trainer:
            trainer.run()
        state = load(newest_checkpoint(tmp_path / str(i) / "run"))
        weights.append(state["learner"]["q"])
        assert state["learner"]["updates"] == (800 - 400) // 4
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name


def test_a_learner_thread_error_reaches_the_caller(tmp_path, monkeypatch):
    original = DQN.update

    def failing(self, batch):
        if self.updates >= 3:
            raise RuntimeError("simulated GPU fault")
        return original(self, batch)

    monkeypatch.setattr(DQN, "update", failing)
    cfg = pong_config(tmp_path, "perf.pipeline=async", "env.num_envs=2")
    with pytest.raises(RuntimeError, match="simulated GPU fault"), Trainer(cfg, quiet=True) as t:
        t.run()


def test_auto_pipeline_is_async_on_a_gpu_and_sync_on_the_cpu():
    assert resolve_pipeline("auto", CPU) == "sync"
    assert resolve_pipeline("auto", GPU) == "async"
    assert resolve_pipeline("async", CPU) == "async"


def random_batch(b: int = 16) -> Batch:
    torch.manual_seed(1)
    obs = torch.randint(0, 256, (b, 4, 84, 84), dtype=torch.uint8)
    return Batch(
        obs,
        torch.randint(0, 6, (b,)),
        torch.randn(b),
        torch.roll(obs, 1, 0),
        (torch.rand(b) < 0.2).float(),
    )


def test_graph_shaped_update_equals_the_eager_update_on_the_cpu():
    """The captured body (static buffers, grads zeroed outside) computes the eager update."""
    torch.manual_seed(0)
    eager = DQN(NatureCNN(4, 6), AgentConfig(), CPU)
    static = copy.deepcopy(eager)
    buffers = Batch(*(torch.empty_like(t) for t in random_batch()))
    for step in range(3):
        batch = random_batch()
        batch = batch._replace(rewards=batch.rewards + step)
        loss_eager = eager.update(batch)
        for buf, fresh in zip(buffers, batch, strict=True):
            buf.copy_(fresh)
        static.optimizer.zero_grad(set_to_none=True)
        loss_static = static.update_step(buffers, zero_grad=False)
        assert torch.equal(loss_eager, loss_static)
    for a, b in zip(eager.q.parameters(), static.q.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.fixture
def deterministic_cuda():
    """cuDNN and cuBLAS without autotuning or TF32, for the duration of a test.

    Adam's first steps move every weight by about ``lr`` whatever the gradient's size, so a
    near-zero gradient whose sign differs between two algorithms (autotuning may pick different
    ones for the eager and the captured run) moves a weight by 2 x lr: exact comparisons need the
    same kernels on both sides.
    """
    backends = torch.backends
    saved = (
        backends.cudnn.benchmark,
        backends.cudnn.deterministic,
        backends.cudnn.allow_tf32,
        backends.cuda.matmul.allow_tf32,
    )
    backends.cudnn.benchmark, backends.cudnn.deterministic = False, True
    backends.cudnn.allow_tf32 = backends.cuda.matmul.allow_tf32 = False
    yield
    (
        backends.cudnn.benchmark,
        backends.cudnn.deterministic,
        backends.cudnn.allow_tf32,
        backends.cuda.matmul.allow_tf32,
    ) = saved


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cuda_graph_update_equals_eager_on_the_gpu(deterministic_cuda):
    torch.manual_seed(0)
    eager = DQN(NatureCNN(4, 6), AgentConfig(), GPU, PerfConfig(amp="off", cuda_graphs="off"))
    graph = DQN(NatureCNN(4, 6), AgentConfig(), GPU, PerfConfig(amp="off", cuda_graphs="on"))
    graph.q.load_state_dict(eager.q.state_dict())
    graph.target.load_state_dict(eager.target.state_dict())
    graph.prepare(Batch(*(t.to(GPU) for t in random_batch())), remaining_updates=0)
    assert graph.fast.captured and graph.updates == 0
    for a, b in zip(eager.q.parameters(), graph.q.parameters(), strict=True):
        assert torch.equal(a, b)  # capturing changed nothing
    for step in range(6):
        batch = Batch(*(t.to(GPU) for t in random_batch()))
        batch = batch._replace(rewards=batch.rewards + step)
        loss_eager, loss_graph = eager.update(batch), graph.update(batch)
        # fused (eager) and capturable (graph) Adam round differently, nothing more
        assert torch.allclose(loss_eager, loss_graph, rtol=1e-5), step
    assert graph.updates == eager.updates == 6
    for a, b in zip(eager.q.parameters(), graph.q.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_compile_changes_speed_only(caplog):
    torch.manual_seed(0)
    learner = DQN(MLP(4, 2, (32, 32)), AgentConfig(), CPU, PerfConfig(compile="on"))
    before = copy.deepcopy(learner.q.state_dict())
    b = 32
    obs = torch.randn(b, 4)
    batch = Batch(obs, torch.randint(0, 2, (b,)), torch.randn(b), obs + 0.1, torch.zeros(b))
    reference = copy.deepcopy(learner)
    assert learner.fast.maybe_compile(10**6, batch)
    for k, v in learner.q.state_dict().items():
        assert torch.equal(v, before[k]), k  # compiling on a batch left the weights alone
    assert learner.updates == 0 and "torch.compile" in learner.describe()
    for _ in range(3):
        learner.update(batch)
        reference.update(batch)
    for a, r in zip(learner.q.parameters(), reference.q.parameters(), strict=True):
        assert torch.allclose(a, r, atol=1e-5)


def test_auto_compile_only_for_long_runs():
    learner = DQN(MLP(4, 2, (8,)), AgentConfig(), CPU, PerfConfig(compile="auto"))
    assert not learner.fast.maybe_compile(1000, random_batch())


@pytest.mark.parametrize(
    ("setting", "capability", "expected"),
    [
        ("auto", (8, 7), torch.bfloat16),  # Orin
        ("auto", (7, 2), torch.float16),  # Xavier
        ("auto", (5, 3), torch.float16),  # Nano
        ("auto", (6, 1), None),  # consumer Pascal: slow fp16
        ("off", (8, 7), None),
        ("fp16", (8, 7), torch.float16),
    ],
)
def test_mixed_precision_choice(setting, capability, expected):
    assert resolve_amp(setting, GPU, capability) is expected


def test_mixed_precision_errors():
    assert resolve_amp("auto", CPU) is None
    with pytest.raises(ConfigError, match=r"perf\.amp=fp16 needs a CUDA GPU"):
        resolve_amp("fp16", CPU)
    with pytest.raises(ConfigError, match=r"compute capability 8\.0 or newer"):
        resolve_amp("bf16", GPU, (7, 2))


def test_cuda_graph_choice():
    assert resolve_cuda_graphs("auto", GPU, torch.bfloat16)
    assert not resolve_cuda_graphs("auto", GPU, torch.float16)  # the grad scaler syncs
    assert not resolve_cuda_graphs("auto", CPU, None)
    with pytest.raises(ConfigError, match="cannot capture the fp16 grad scaler"):
        resolve_cuda_graphs("on", GPU, torch.float16)
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        resolve_cuda_graphs("on", CPU, None)


def test_optimizer_state_from_a_capturable_optimizer_loads_on_the_cpu():
    gpu_like = DQN(NatureCNN(4, 6), AgentConfig(), CPU)
    gpu_like.update(random_batch())
    state = gpu_like.state_dict()
    for group in state["optimizer"]["param_groups"]:  # as a CUDA-graph run saves it
        group.update(lr=torch.tensor(group["lr"]), capturable=True, fused=None)
    here = DQN(NatureCNN(4, 6), AgentConfig(), CPU)
    here.load_state_dict(state)
    assert isinstance(here.optimizer.param_groups[0]["lr"], float)
    assert not here.optimizer.param_groups[0]["capturable"]
    here.update(random_batch())  # and it steps


def m(n: int, threads: int, sps: float) -> ActorMeasurement:
    return ActorMeasurement(n, threads, sps)


def test_autotune_picks_the_fewest_envs_that_keep_the_learner_busy():
    fake = [m(1, 1, 900), m(2, 2, 1400), m(4, 2, 2600), m(8, 2, 3000), m(16, 2, 3100)]
    # learner: 500 updates/s x 4 = 2000 steps/s needed; 4 envs give 2600 (async: min(...))
    choice = choose(fake, 500, 4, "async")
    assert (choice.num_envs, choice.threads) == (4, 2)
    assert choice.limit_steps_per_s == 2000 and "learner is the limit" in choice.reason
    # a slow learner: one env is already enough
    assert choose(fake, 30, 4, "async").num_envs == 1


def test_autotune_says_when_the_actor_is_the_limit():
    fake = [m(1, 1, 300), m(4, 2, 800), m(8, 2, 820)]
    choice = choose(fake, 500, 4, "async")
    # 8 envs are only 2.5% faster than 4: four are enough, and the actor limits either way
    assert choice.num_envs == 4 and "the actor is the limit" in choice.reason


def test_sync_prediction_rewards_a_faster_actor_less():
    assert predict(1000, 1000, "async") == 1000
    assert predict(1000, 1000, "sync") == 500
    fake = [m(1, 1, 1300), m(4, 2, 2600), m(8, 2, 2700)]
    assert choose(fake, 31, 4, "sync").num_envs == 1  # 124 steps/s limit: the actor hardly counts


@pytest.mark.slow
def test_autotune_in_the_trainer_writes_its_choice(tmp_path, caplog):
    import tomllib

    cfg = pong_config(tmp_path, "perf.autotune=true", steps=500)
    with caplog.at_level("INFO"), Trainer(cfg, quiet=True) as trainer:
        trainer.run()
        chosen = trainer.autotune
    assert chosen is not None and "autotune: env.num_envs=" in caplog.text
    written = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert written["env"]["num_envs"] == chosen.num_envs
    assert written["env"]["threads"] == chosen.threads


@pytest.mark.slow
def test_bench_json(cli):
    r = cli(
        "bench",
        "--seconds",
        "1",
        "--json",
        "--set",
        "agent.learning_starts=64",
        "--set",
        "agent.batch_size=8",
        "--set",
        "replay.capacity=2000",
    )
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert set(doc["env_steps_per_s"]) == {"1", "4", "8", "16"}
    assert set(doc["act_per_s"]) == {"1", "8", "32"}
    assert {"eager", "channels_last"} <= set(doc["updates_per_s"])
    limit = doc["learner_bound_limit"]
    assert limit["steps_per_s"] == pytest.approx(  # both rounded: a loaded machine is slow
        doc["train_freq"] * limit["updates_per_s"], rel=0.01, abs=0.1
    )
    assert limit["measured_s"] >= 3  # never a one-second limit
    assert "perf.amp=" in limit["update_variant"]
    assert any("--seconds 1 is too short for steady figures" in w for w in doc["warnings"])
    assert [(lp["mode"], lp["num_envs"]) for lp in doc["loops"]] == [
        ("sync", 1),
        ("sync", 4),
        ("async", 4),
    ]
    for loop in doc["loops"]:
        assert loop["steps_per_s"] > 0 and 0 < loop["learner_busy"] <= 1
        assert 0 < loop["share_of_limit"] <= 1.0  # a loop cannot beat the learner bound
        if "share_note" not in loop:
            assert loop["share_of_limit"] == pytest.approx(  # the JSON's figures are rounded
                loop["steps_per_s"] / limit["steps_per_s"], rel=0.03, abs=0.01
            )
        assert loop["updates"] > 0 and loop["ms_per_update_in_loop"] > 0
    assert doc["loops"][0]["vs_sync_1_env"] == 1.0
    assert doc["auto_pipeline"] == ("async" if CUDA else "sync")
    saved = doc["replay_save"]
    assert saved["full"]["transitions"] == saved["capacity"] == 2000
    assert 0 < saved["incremental"]["transitions"] < 2000  # only the changed range
    for save in (saved["full"], saved["incremental"]):
        assert save["bytes"] > 0 and save["ratio"] > 1  # Pong frames compress
        assert save["actor_longest_pause_ms"] > 0 and "snapshot_ms" in save
    assert saved["restore_s"] > 0 and "zlib-1" in saved["codecs"]


@pytest.mark.parametrize(
    ("sps", "limit", "share", "says"),
    [
        (50.0, 100.0, 0.5, ""),
        (100.0, 100.0, 1.0, ""),
        (108.0, 100.0, 1.0, "108% measured: at the limit within noise"),
        (385.0, 100.0, 1.0, "385% measured, which a loop cannot reach"),
        (99.96, 100.0, 0.9996, ""),  # from unrounded figures, not 100.0 / 100
    ],
)
def test_a_loops_share_of_the_limit_is_at_most_one(sps, limit, share, says):
    from edgerl.bench import share_of_limit

    got, note = share_of_limit(sps, limit)
    assert got == pytest.approx(share) and (says in note if says else note == "")
