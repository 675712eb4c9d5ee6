"""The replay save's cost per checkpoint (the last part of ``edgerl bench``), with real frames.

A replay of ``replay.capacity`` is filled from the real game, then saved whole and again after
more env steps, each while an actor goes on writing at a board's pace, and restored; the figures
are the save's time and CPU, its bytes per transition, the actor's longest pause, and what the
stdlib codecs would cost instead of zlib level 1 (docs/training.md, "Replay on disk").
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgerl.config import Config
from edgerl.envs import make_env, probe


def _codecs(frames: np.ndarray) -> dict[str, dict[str, float]]:
    """Ratio and single-core MB/s of the stdlib codecs on ``frames`` (why zlib level 1)."""
    import bz2
    import lzma
    import zlib

    raw = frames.tobytes()
    codecs = {
        "zlib-1": lambda b: zlib.compress(b, 1),
        "zlib-6": lambda b: zlib.compress(b, 6),
        "bz2-1": lambda b: bz2.compress(b, 1),
        "lzma-0": lambda b: lzma.compress(b, preset=0),
    }
    out = {}
    for name, compress in codecs.items():
        started = time.process_time()
        packed = compress(raw)
        cpu = max(time.process_time() - started, 1e-6)
        out[name] = {
            "ratio": round(len(raw) / len(packed), 1),
            "mb_per_s": round(len(raw) / cpu / 1e6),
        }
    return out


def replay_save_cost(cfg: Config, device: torch.device, steps: int) -> dict[str, Any]:
    """What saving the replay costs per checkpoint, with real frames of ``cfg.env.id``.

    Fills a replay of ``replay.capacity`` from the real game (random actions), then times a
    checkpoint's replay save of the whole ring (the first save, or one after ``capacity`` steps)
    and of ``steps`` changed env steps, each while an actor keeps writing recorded observations
    (its longest write is the actor's longest pause, snapshot included), and the restore.
    """
    from edgerl.memories.kinds import ReplayKind
    from edgerl.memories.replay import ReplayBuffer
    from edgerl.memories.replay.store import ReplayStore

    spec = probe(cfg.env)
    num_envs = cfg.env.num_envs
    replay_device = ReplayKind().where(cfg, device)
    replay = ReplayBuffer(spec, cfg.replay.capacity, num_envs, replay_device, out_device=device)
    env = make_env(dataclasses.replace(cfg.env, num_envs=num_envs), spec)
    rng = np.random.default_rng(0)
    recorded = []
    try:
        replay.add_first(env.reset(seed=0))
        while int(replay.written.min()) < replay.slots + steps // num_envs:
            actions = rng.integers(spec.num_actions, size=num_envs)
            r = env.step(actions)
            replay.add(actions, r.rewards, r.terminated, r.truncated, r.obs, r.final_obs)
            if len(recorded) < 256:
                recorded.append((actions, r.rewards, r.obs))
    finally:
        env.close()
    workdir = Path(tempfile.mkdtemp(prefix="edgerl-bench-replay-"))
    none = np.zeros(num_envs, dtype=bool)

    def actor_step(i: int) -> float:
        actions, rewards, obs = recorded[i % len(recorded)]
        started = time.perf_counter()
        replay.add(actions, rewards, none, none, obs, None)
        return time.perf_counter() - started

    def save(store: ReplayStore) -> dict[str, Any]:
        baseline = max(actor_step(i) for i in range(64))
        started = time.perf_counter()
        job = store.snapshot(step=0)
        longest = time.perf_counter() - started
        job.start()
        i = 0
        while not job.done:  # the actor goes on at a board's pace (400 steps/s) meanwhile
            longest = max(longest, actor_step(i))
            i += 1
            time.sleep(num_envs / 400)
        job.wait()
        if job.error:
            raise RuntimeError(job.error)
        store.commit(job)
        r = job.result
        return {
            "transitions": r.slots,
            "seconds": round(r.save_s, 3),
            "cpu_s": round(r.cpu_s, 3),
            "bytes": r.bytes,
            "bytes_per_transition": round(r.bytes / max(1, r.slots), 1),
            "ratio": round(r.raw_bytes / max(1, r.bytes), 1),
            "snapshot_ms": round(r.pause_s * 1e3, 2),
            "actor_longest_pause_ms": round(longest * 1e3, 2),
            "actor_longest_write_without_save_ms": round(baseline * 1e3, 2),
            "manifest": r.manifest,
        }

    try:
        store = ReplayStore(workdir, replay)
        full = save(store)
        # ``steps`` more env steps of real frames (recorded ones would flatter the ratio).
        env = make_env(dataclasses.replace(cfg.env, num_envs=num_envs), spec)
        try:
            replay.add_first(env.reset(seed=1))
            for _ in range(steps // num_envs):
                actions = rng.integers(spec.num_actions, size=num_envs)
                r = env.step(actions)
                replay.add(actions, r.rewards, r.terminated, r.truncated, r.obs, r.final_obs)
        finally:
            env.close()
        incremental = save(store)
        fresh = ReplayBuffer(spec, cfg.replay.capacity, num_envs, replay_device, out_device=device)
        started = time.perf_counter()
        ReplayStore(workdir, fresh).restore(incremental["manifest"])
        restore_s = time.perf_counter() - started
        sample = replay.items[0, : min(replay.slots, 2048)].cpu().numpy()
        return {
            "capacity": replay.capacity,
            "num_envs": num_envs,
            "device": replay_device.type,
            "full": full,
            "incremental": incremental,
            "restore_s": round(restore_s, 3),
            "restore_transitions_per_s": round(fresh.valid / max(restore_s, 1e-9)),
            "codecs": _codecs(sample),
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def render_replay_save(rs: dict[str, Any]) -> list[str]:
    """The replay save's cost per checkpoint, as report lines."""
    lines = []
    for name in ("full", "incremental"):
        r = rs[name]
        lines.append(
            f"replay save ({name}, {r['transitions']:,} transitions): {r['seconds']:.2f} s in the "
            f"background ({r['cpu_s']:.2f} s CPU), {r['bytes'] / 1e6:,.1f} MB "
            f"({r['bytes_per_transition']:,.0f} bytes per transition, {r['ratio']}x), actor's "
            f"longest pause {r['actor_longest_pause_ms']:.1f} ms (snapshot {r['snapshot_ms']:.1f} "
            f"ms; longest write without a save {r['actor_longest_write_without_save_ms']:.1f} ms)"
        )
    lines.append(
        f"replay restore: {rs['capacity']:,} transitions in {rs['restore_s']:.2f} s "
        f"({rs['restore_transitions_per_s']:,} per s)"
    )
    lines.append(
        "replay codecs: "
        + ", ".join(f"{k} {v['ratio']}x at {v['mb_per_s']:,} MB/s" for k, v in rs["codecs"].items())
    )
    return lines
