"""``edgerl doctor --deep``: real work on the device ``perf.device=auto`` picks, with the learner
the config names.

For a replay learner, a replay is allocated there and filled from a real game, and a batch
sampled from it. A learner whose update runs in modes (its kind's ``update_modes``: DQN's) makes
a few updates on those batches in every mode that applies to the device and compares them
(:mod:`edgerl.doctor.modes`); any other (SAC) learns a few units from the replay, which must move
its weights with finite losses. For a rollout learner (PQN, PPO), a rollout is filled from a
real game on the device and learned from. The learner is then exported to ONNX and checked in
ONNX Runtime against PyTorch, and where TensorRT is present an engine is built and checked, all
through the code that training and `edgerl export` run; learners are built by the factory
training uses.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgerl.doctor.core import Check, Context, guarded
from edgerl.doctor.deep_state import UPDATES, DeepState, Outcome
from edgerl.errors import MissingDependencyError

log = logging.getLogger(__name__)

# The game when the configured one has neither frames (the Nature CNN) nor continuous actions (a
# Gaussian head: checked on the configured game), for a learner that can learn it.
DEEP_ENV = "ALE/Pong-v5"
REPLAY_ENVS = 4
REPLAY_STEPS = 64  # per environment: a few hundred real transitions
REPLAY_SLOTS = 1024  # per environment: a small replay (7 MB), not the configured one
OBSERVATIONS = 32  # game frames the exports are checked on
NO_LEARNER = "needs a learner that learned (see the update/eager or rollout line)"
ROLLOUT_ENVS = 4  # a rollout learner's check: a small rollout of the real game
ROLLOUT_STEPS = 16


def deep_checks(ctx: Context) -> Iterator[Check]:
    """Every deep check, in order; a check that cannot run says which earlier line to read."""
    from edgerl.hw.device import configure_for_training

    if not ctx.torch_ok or ctx.device is None:
        yield Check("deep", "skip", "needs a supported PyTorch and a device (see the lines above)")
        return
    from edgerl.config.learners import learner_info
    from edgerl.learners.factory import uses_replay

    state = DeepState(ctx.device)
    configure_for_training(ctx.device, ctx.cfg)  # threads, cuDNN autotuning and TF32, as training
    with tempfile.TemporaryDirectory(prefix="edgerl-doctor-") as tmp:
        state.workdir = Path(tmp)
        memory = learner_info(ctx.cfg.agent.algo).memory
        if uses_replay(ctx.cfg):
            yield from _replay_checks(ctx, state)
        elif memory == "rollout":
            yield from guarded("rollout", lambda c: check_rollout(c, state), ctx)
        else:  # the genetic algorithm's episode scores: nothing to learn from to smoke-check
            yield Check(
                "learner",
                "skip",
                f"agent.algo={ctx.cfg.agent.algo} learns from {memory}: no smoke check of its "
                "learning here (its forward passes are the export's below)",
            )
        yield from guarded("onnx export", lambda c: check_onnx_export(c, state), ctx)
        yield from guarded("onnx on the gpu", lambda c: check_onnx_gpu(c, state), ctx)
        yield from guarded("tensorrt engine", lambda c: check_tensorrt_engine(c, state), ctx)


def _replay_checks(ctx: Context, state: DeepState) -> Iterator[Check]:
    """A replay learner's checks: the replay, then the update in every mode."""
    yield from guarded("replay", lambda c: check_replay(c, state), ctx)
    if state.batches is None:
        yield Check("update", "skip", "needs a replay sample (see the replay line)")
        return
    from edgerl.learners.kinds import learner_kind

    if not learner_kind(ctx.cfg.agent.algo).update_modes:
        yield from guarded("update/eager", lambda c: check_learning(c, state), ctx)
        return
    from edgerl.doctor.modes import check_update, update_modes

    for mode in update_modes(ctx.device):
        yield from guarded(f"update/{mode.name}", lambda c, m=mode: check_update(c, state, m), ctx)


def _deep_spec(ctx: Context) -> Any:
    from edgerl.config import with_values
    from edgerl.config.presets import apply_presets
    from edgerl.envs import probe
    from edgerl.errors import EdgerlError
    from edgerl.learners.kinds import learner_kind

    own = ctx.spec is not None and (ctx.spec.has_frames or ctx.spec.continuous)
    spec = ctx.spec if own else probe(DEEP_ENV)
    if spec is not ctx.spec and ctx.spec is not None:
        try:
            learner_kind(ctx.cfg.agent.algo).refuse_game(spec, ctx.cfg.agent.algo)
        except EdgerlError:  # it learns the configured game's kind of actions only
            spec = ctx.spec
    cfg = (
        ctx.cfg
        if spec is ctx.spec
        else apply_presets(
            with_values(ctx.cfg, {"env.id": spec.id, "env.make_kwargs": {}}), "frames"
        )
    )
    return spec, cfg


def check_replay(ctx: Context, state: DeepState) -> Check:
    """A replay on the device, filled from the real game, and batches sampled from it."""
    from edgerl.envs import make_env, random_actions
    from edgerl.hw.device import indexed
    from edgerl.memories.replay import ReplayBuffer
    from edgerl.words import fmt_bytes

    started = time.monotonic()
    state.spec, state.cfg = spec, cfg = _deep_spec(ctx)
    device = indexed(state.device)
    env_cfg = dataclasses.replace(cfg.env, num_envs=REPLAY_ENVS, threads=0)
    replay = ReplayBuffer(spec, REPLAY_ENVS * REPLAY_SLOTS, REPLAY_ENVS, device, seed=0)
    rng = np.random.default_rng(0)
    with make_env(env_cfg, spec) as env:
        replay.add_first(env.reset(seed=0))
        for _ in range(REPLAY_STEPS):
            actions = random_actions(spec, REPLAY_ENVS, rng)
            r = env.step(actions)
            rewards = spec.learning_rewards(r.rewards)
            replay.add(actions, rewards, r.terminated, r.truncated, r.obs, r.final_obs)
    batch_size = cfg.agent.batch_size
    batches = [replay.sample(batch_size) for _ in range(UPDATES)]
    b = batches[0]
    problems = []
    if b.obs.device != device or b.actions.device != device:
        problems.append(f"the batch is on {b.obs.device}, not {device}")
    dtype = getattr(torch, spec.obs_dtype)
    if tuple(b.obs.shape) != (batch_size, *spec.obs_shape) or b.obs.dtype != dtype:
        problems.append(f"observations are {tuple(b.obs.shape)} {b.obs.dtype}")
    elif spec.has_frames and not torch.equal(b.obs[:, 1:], b.next_obs[:, :-1]):
        problems.append("next observations are not the observations one frame on")
    if spec.has_frames and not bool((b.obs[:, -1] != 0).any()):
        problems.append("the sampled frames are blank")
    found = (
        f"{replay.capacity:,} transitions ({fmt_bytes(replay.nbytes)}) on {device}, "
        f"{len(replay):,} real {spec.id} steps stored, {UPDATES} batches of {batch_size} "
        f"sampled"
    )
    data = {"device": str(device), "seconds": round(time.monotonic() - started, 2)}
    if problems:
        return Check(
            "replay",
            "fail",
            f"{found}, but {'; '.join(problems)}",
            "a bug in edgerl's replay on this device: report it with this output",
            data,
        )
    state.batches, state.replay = batches, replay
    right = "stacks and device right" if spec.has_frames else "shapes and device right"
    return Check("replay", "pass", f"{found}: {right}", data=data)


def check_rollout(ctx: Context, state: DeepState) -> Check:
    """A rollout learner (PQN) as training builds it: a rollout on the device filled from the
    real game, then one rollout's learning: finite losses and weights that move."""
    from edgerl.config import with_values
    from edgerl.config.learners import learner_info
    from edgerl.envs import make_env, random_actions
    from edgerl.hw.device import indexed
    from edgerl.learners.factory import build_learner, build_memory

    started = time.monotonic()
    spec, cfg = _deep_spec(ctx)
    cfg = dataclasses.replace(
        cfg,
        env=dataclasses.replace(cfg.env, num_envs=ROLLOUT_ENVS, threads=0),
        pqn=dataclasses.replace(cfg.pqn, rollout_steps=ROLLOUT_STEPS, minibatches=4, epochs=1),
        perf=dataclasses.replace(cfg.perf, compile="off"),
    )
    # The rollout's length is its learner's key (PPO has its own), not always PQN's.
    cfg = with_values(cfg, {learner_info(cfg.agent.algo).rollout_key: ROLLOUT_STEPS})
    state.spec, state.cfg = spec, cfg
    device = indexed(state.device)
    torch.manual_seed(0)
    learner = build_learner(cfg, spec, device)
    memory = build_memory(cfg, spec, device)
    before = [p.detach().float().cpu().clone() for p in learner.q.parameters()]
    rng = np.random.default_rng(0)
    with make_env(cfg.env, spec) as env:
        memory.add_first(env.reset(seed=0))
        while not memory.full:
            actions = random_actions(spec, ROLLOUT_ENVS, rng)
            r = env.step(actions)
            rewards = spec.learning_rewards(r.rewards)
            memory.add(actions, rewards, r.terminated, r.truncated, r.obs, r.final_obs)
    learner.learn(memory, ROLLOUT_ENVS * ROLLOUT_STEPS, 1)
    learner.losses.flush()
    loss = learner.losses.take()
    moved = max(
        float((p.detach().float().cpu() - b).abs().max())
        for p, b in zip(learner.q.parameters(), before, strict=True)
    )
    found = (
        f"{ROLLOUT_STEPS} steps x {ROLLOUT_ENVS} real {spec.id} environments on {device}, one "
        f"rollout learned from ({learner.describe()}, {learner.updates} updates): mean loss "
        f"{loss:.4f}"
    )
    data = {"loss": loss, "moved": moved, "seconds": round(time.monotonic() - started, 2)}
    if not math.isfinite(loss) or not moved > 0:
        how = "the weights did not move" if moved == 0 else "the loss is not finite"
        return Check(
            "rollout",
            "fail",
            f"{found}; {how}",
            "a bug in edgerl or this PyTorch build: report it with this output",
            data,
        )
    weights = [p.detach().float().cpu() for p in learner.q.parameters()]
    state.outcomes["rollout"] = Outcome([loss], weights, learner.describe(), learner)
    return Check("rollout", "pass", f"{found}; the weights moved", data=data)


def check_learning(ctx: Context, state: DeepState) -> Check:
    """A learner without update modes (SAC) as training builds it, learning :data:`UPDATES`
    units from the replay filled from the real game: finite losses and weights that move."""
    from edgerl.learners.factory import build_learner

    started = time.monotonic()
    spec, cfg = state.spec, state.cfg
    torch.manual_seed(0)
    learner = build_learner(cfg, spec, state.device)
    before = [p.detach().float().cpu().clone() for p in learner.q.parameters()]
    losses = []
    for unit in range(UPDATES):
        learner.learn(state.replay, unit + 1, 1)
        learner.losses.flush()
        losses.append(learner.losses.take())
    weights = [p.detach().float().cpu() for p in learner.q.parameters()]
    moved = max(float((w - b).abs().max()) for w, b in zip(weights, before, strict=True))
    shown = ", ".join(f"{v:.4f}" for v in losses)
    found = f"{UPDATES} units of learning ({learner.describe()}): losses {shown}"
    data = {"losses": losses, "moved": moved, "seconds": round(time.monotonic() - started, 2)}
    if not all(math.isfinite(v) for v in losses) or not moved > 0:
        how = "the weights did not move" if moved == 0 else "a loss is not finite"
        fix = "a bug in edgerl or this PyTorch build: report it with this output"
        return Check("update/eager", "fail", f"{found}; {how}", fix, data)
    state.outcomes["eager"] = Outcome(losses, weights, learner.describe(), learner)
    return Check("update/eager", "pass", f"{found}; the weights moved", data=data)


def _checkpoint(state: DeepState) -> Path:
    """A real checkpoint of the learner after its learning, as training writes one."""
    from edgerl.files.checkpoint import Checkpoint, CheckpointStore

    if state.checkpoint is not None:
        return state.checkpoint
    assert state.workdir is not None
    trained = state.trained
    if trained is None:
        raise RuntimeError("no learner to export: the update/eager or rollout check did not run")
    checkpoint = Checkpoint(
        kind=trained.learner.kind,
        step=UPDATES,
        env=state.spec.to_dict(),
        config=state.cfg.to_dict(),
        learner=trained.learner.state_dict(),
    )
    state.checkpoint = CheckpointStore(state.workdir / "checkpoints", keep=1).save(checkpoint)
    return state.checkpoint


def check_onnx_export(ctx: Context, state: DeepState) -> Check:
    """`edgerl export --onnx` of the updated learner: onnx.checker, then ONNX Runtime against
    PyTorch on real game frames."""
    from edgerl.export.run import ExportRequest, run_export

    if state.trained is None:
        return Check("onnx export", "skip", NO_LEARNER)
    started = time.monotonic()
    request = ExportRequest(
        checkpoint=_checkpoint(state), out=state.workdir / "onnx", observations=OBSERVATIONS
    )
    try:
        row = run_export(request)[0]
    except MissingDependencyError as e:
        return Check("onnx export", "skip", str(e), "pip install 'edgerl[export]'")
    state.onnx = row.file
    found = (
        f"{row.backend} matches PyTorch on {OBSERVATIONS} {state.spec.id} "
        f"{'frames' if state.spec.has_frames else 'observations'}: "
        f"{row.agreement.describe()}; p50 latency {row.latency['p50']:.0f} us"
    )
    data = {
        "agreement": row.agreement.to_dict(),
        "latency_us": row.latency,
        "seconds": round(time.monotonic() - started, 2),
    }
    return Check("onnx export", "pass", found, data=data)


def check_onnx_gpu(ctx: Context, state: DeepState) -> Check:
    """The exported ONNX file opened as `edgerl play --model x.onnx` opens it, on ONNX Runtime's
    GPU providers (the TensorRT provider with its engine cache), against PyTorch."""
    from edgerl.doctor.software import GPU_PROVIDERS

    name = "onnx on the gpu"
    if state.device.type != "cuda":
        return Check(name, "skip", "no CUDA GPU: ONNX policies play on the CPU")
    if state.onnx is None or state.checkpoint is None:
        return Check(name, "skip", "needs the ONNX export (see the onnx export line)")
    import onnxruntime as ort

    if not any(p in ort.get_available_providers() for p in GPU_PROVIDERS):
        return Check(name, "skip", "this ONNX Runtime has no GPU provider (see onnxruntime)")
    from edgerl.export.common import check_agreement, collect_observations
    from edgerl.policies import load_policy
    from edgerl.policies.torch import TorchPolicy

    started = time.monotonic()
    policy = load_policy(model=state.onnx)
    torch_policy = TorchPolicy.from_file(state.checkpoint)
    obs = collect_observations(torch_policy.env_config, OBSERVATIONS)
    reference = torch_policy.q_values(obs).astype(np.float64)
    # The CUDA provider computes in TF32 and the TensorRT provider may pick FP16 tactics.
    agreement = check_agreement(policy, obs, reference, "fp16")
    provider = getattr(policy, "providers", ["?"])[0]
    found = f"{provider} matches PyTorch: {agreement.describe()}"
    data = {
        "provider": provider,
        "agreement": agreement.to_dict(),
        "seconds": round(time.monotonic() - started, 2),
    }
    if agreement.ok:
        return Check(name, "pass", found, data=data)
    return Check(
        name,
        "fail",
        found,
        f"play ONNX policies on the CPU or export a TensorRT engine (edgerl export --trt); "
        f"report it with ONNX Runtime {ort.__version__}",
        data,
    )


def check_tensorrt_engine(ctx: Context, state: DeepState) -> Check:
    """`edgerl export --trt` where TensorRT and a GPU are here: build, run, agree."""
    import importlib.util

    from edgerl.export.run import ExportRequest, run_export

    if importlib.util.find_spec("tensorrt") is None:
        return Check("tensorrt engine", "skip", "TensorRT is not installed (see the tensorrt line)")
    if state.device.type != "cuda":
        return Check("tensorrt engine", "skip", "TensorRT needs a CUDA GPU (see the cuda line)")
    if state.trained is None:
        return Check("tensorrt engine", "skip", NO_LEARNER)
    started = time.monotonic()
    request = ExportRequest(
        checkpoint=_checkpoint(state),
        out=state.workdir / "trt",
        trt=True,
        observations=OBSERVATIONS,
    )
    row = run_export(request)[1]  # ExportError (no build, or no agreement) is a fail line
    found = (
        f"{row.precision} engine built in {row.extra.get('build_s', '?')} s ({row.backend}), "
        f"matches PyTorch: {row.agreement.describe()}; p50 latency {row.latency['p50']:.0f} us"
    )
    data = {
        "precision": row.precision,
        "agreement": row.agreement.to_dict(),
        "latency_us": row.latency,
        "seconds": round(time.monotonic() - started, 2),
    }
    return Check("tensorrt engine", "pass", found, data=data)
