"""The frame-deduplicated replay (replay.py) and its sampler (replay_sample.py) against a reference
model of what the environment showed: stacks, n-step returns computed by hand from the episodes
as they happened, the uniform draw, and memory planning (replay_memory.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from edgerl.envs import EnvSpec
from edgerl.errors import DeviceError, ReplayMemoryError
from edgerl.memories.budget import available_memory, bytes_per_transition, plan_memory
from edgerl.memories.replay import ReplayBuffer

STACK = 4
# Tiny "frames": 2x2 pixels; pixel 0/1 carry a 16-bit id (0 = padding), pixel 2 the env.
SPEC = EnvSpec("test/Frames-v0", "frames", (STACK, 2, 2), "uint8", 6, tuple("abcdef"))
ATARI = EnvSpec("ALE/Pong-v5", "frames", (4, 84, 84), "uint8", 6, tuple("abcdef"))


def frame(fid: int, env: int) -> np.ndarray:
    return np.array([[fid & 255, fid >> 8], [env, 7]], dtype=np.uint8)


def frame_id(f: np.ndarray) -> int:
    return int(f[0, 0]) | (int(f[0, 1]) << 8)


class ReferenceEnvs:
    """Vector env stand-in that keeps the true stacks, and the transitions they make."""

    def __init__(self, num_envs: int, rng: np.random.Generator) -> None:
        self.n = num_envs
        self.rng = rng
        self.next_id = 1
        self.stacks = [self._new_episode(e) for e in range(num_envs)]
        # newest obs frame id -> (obs, action, reward, next obs, terminated, episode ended)
        self.transitions: dict[int, tuple] = {}

    def _frame(self, env: int) -> np.ndarray:
        f = frame(self.next_id, env)
        self.next_id += 1
        return f

    def _new_episode(self, env: int) -> list[np.ndarray]:
        zeros = [np.zeros((2, 2), np.uint8)] * (STACK - 1)
        return [*zeros, self._frame(env)]

    def obs(self) -> np.ndarray:
        return np.stack([np.stack(s) for s in self.stacks])

    def step(self, actions: np.ndarray, end_prob: float):
        rewards = self.rng.normal(size=self.n).astype(np.float32)
        ends = self.rng.random(self.n) < end_prob
        terminated = ends & (self.rng.random(self.n) < 0.5)
        truncated = ends & ~terminated
        final = np.zeros((self.n, STACK, 2, 2), np.uint8)
        for e in range(self.n):
            before = np.stack(self.stacks[e])
            self.stacks[e] = [*self.stacks[e][1:], self._frame(e)]
            after = np.stack(self.stacks[e])
            self.transitions[frame_id(before[-1])] = (
                before,
                int(actions[e]),
                float(rewards[e]),
                after,
                bool(terminated[e]),
                bool(ends[e]),
            )
            if ends[e]:
                final[e] = after
                self.stacks[e] = self._new_episode(e)
        return rewards, terminated, truncated, self.obs(), (final if ends.any() else None)


def fill(buffer: ReplayBuffer, envs: ReferenceEnvs, steps: int, end_prob: float) -> None:
    buffer.add_first(envs.obs())
    for _ in range(steps):
        actions = envs.rng.integers(6, size=envs.n)
        rewards, term, trunc, obs, final = envs.step(actions, end_prob)
        buffer.add(actions, rewards, term, trunc, obs, final)


def n_step_target(envs: ReferenceEnvs, fid: int, n: int, gamma: float):
    """The n-step target of the transition from frame ``fid``, by hand from the episode as it
    happened: (obs, action, return, bootstrap obs, discount), or None while the window is not
    complete (its later transitions have not happened yet)."""
    obs, action, *_ = envs.transitions[fid]
    ret, k = 0.0, 0
    while True:
        _, _, reward, after, terminal, ended = envs.transitions[fid]
        ret += gamma**k * reward
        k += 1
        if terminal:
            return obs, action, ret, after, 0.0
        if ended or k == n:
            return obs, action, ret, after, gamma**k
        fid = frame_id(after[-1])
        if fid not in envs.transitions:
            return None


def check_samples(
    buffer: ReplayBuffer, envs: ReferenceEnvs, rounds: int, n: int = 1, gamma: float = 0.99
) -> list[int]:
    """Sample ``rounds`` batches and check each transition and its n-step target against what
    the envs showed; returns the newest frame ids seen, one per sampled row."""
    seen = []
    for _ in range(rounds):
        batch = buffer.sample(32)
        assert all(t.device == buffer.out_device for t in batch)
        batch = type(batch)(*(t.cpu() for t in batch))
        rows = [i for i in range(32) if batch.weights[i] == 1.0]
        assert batch.weights.sum() == len(rows)  # the other rows have weight 0
        for i in rows:
            obs = batch.obs[i].numpy()
            fid = frame_id(obs[-1])
            assert fid in envs.transitions, "sampled a transition that never happened"
            target = n_step_target(envs, fid, n, gamma)
            assert target is not None, "sampled a transition whose n steps have not happened"
            want_obs, action, ret, want_next, discount = target
            np.testing.assert_array_equal(obs, want_obs)  # zero padding before episode starts
            np.testing.assert_array_equal(batch.next_obs[i].numpy(), want_next)
            assert batch.actions[i].item() == action
            assert batch.rewards[i].item() == pytest.approx(ret, rel=1e-5, abs=1e-5)
            assert batch.discounts[i].item() == pytest.approx(discount, rel=1e-6)
            seen.append(fid)
    # Rows of weight 0 only where a small ring holds few valid starts among the draws.
    assert len(seen) > 0.7 * 32 * rounds
    return seen


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    ("storage", "learner"), [("cuda", "cuda"), ("cuda", "cpu"), ("cpu", "cuda")]
)
def test_samples_are_exact_across_devices(storage, learner):
    """GPU storage written through pinned staging; GPU to CPU batches copied synchronously (an
    asynchronous device-to-host copy can be read before it lands); CPU to GPU through pinned
    memory."""
    envs = ReferenceEnvs(3, np.random.default_rng(5))
    buffer = ReplayBuffer(SPEC, 96, 3, storage, seed=1, out_device=learner)
    fill(buffer, envs, 400, 0.15)
    check_samples(buffer, envs, rounds=20)


def test_the_packed_writes_of_a_cuda_replay_land_where_the_host_wrote():
    """A CUDA replay writes each vector step as one packed copy through its staging ring (frames,
    then int32 slot updates), scattered where the sampler reads. Run here on CPU tensors
    standing in for the device's and plain buffers for the pinned ones: after writes of every
    kind (every environment, ended episodes with their final frames, a subset of environments
    as ALE's async mode writes), the sampler's tensors hold what the host wrote, the frames are
    those of a plain replay given the same writes, and samples are exact."""
    envs = ReferenceEnvs(3, np.random.default_rng(5))
    packed = ReplayBuffer(SPEC, 96, 3, "cpu", seed=1)
    packed._packed_writes(pin=False)
    plain = ReplayBuffer(SPEC, 96, 3, "cpu", seed=1)
    assert packed.storage.flags.data_ptr() != torch.from_numpy(packed.flags).data_ptr()

    def both(method: str, *args, **kwargs) -> None:
        getattr(packed, method)(*args, **kwargs)
        getattr(plain, method)(*args, **kwargs)

    both("add_first", envs.obs())
    for _ in range(150):
        actions = envs.rng.integers(6, size=envs.n)
        rewards, term, trunc, obs, final = envs.step(actions, 0.15)
        both("add", actions, rewards, term, trunc, obs, final)
    check_samples(packed, envs, rounds=10)
    rng = np.random.default_rng(6)
    for _ in range(100):  # subsets of environments, episodes ending among them
        ids = np.sort(rng.choice(3, size=int(rng.integers(1, 4)), replace=False))
        k = len(ids)
        obs = rng.integers(0, 256, size=(k, STACK, 2, 2), dtype=np.uint8)
        ended = rng.random(k) < 0.2
        final = rng.integers(0, 256, size=(k, STACK, 2, 2), dtype=np.uint8)
        term, trunc = ended & (rng.random(k) < 0.5), ended.copy()
        trunc &= ~term
        actions, rewards = rng.integers(6, size=k), rng.normal(size=k).astype(np.float32)
        both("add", actions, rewards, term, trunc, obs, final if ended.any() else None, envs=ids)
    st = packed.storage
    for name in ("actions", "rewards", "flags", "head", "count"):
        host = getattr(packed, name)
        np.testing.assert_array_equal(host, getattr(plain, name))
        np.testing.assert_array_equal(getattr(st, name).numpy(), host, err_msg=name)
    assert torch.equal(packed.items, plain.items)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_replay_never_waits_for_queued_gpu_work():
    """Writing and sampling a GPU replay must not synchronise the stream: the learner samples
    while its earlier updates still run, and the actor writes while the learner computes."""
    envs = ReferenceEnvs(3, np.random.default_rng(7))
    buffer = ReplayBuffer(SPEC, 96, 3, "cuda", seed=1)
    fill(buffer, envs, 50, 0.15)  # the first writes allocate; not what is checked
    torch.cuda.set_sync_debug_mode("error")  # raises on any synchronising CUDA call
    try:
        for _ in range(200):
            actions = envs.rng.integers(6, size=envs.n)
            rewards, term, trunc, obs, final = envs.step(actions, 0.15)
            buffer.add(actions, rewards, term, trunc, obs, final)
        for _ in range(20):
            buffer.sample(32)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    check_samples(buffer, envs, rounds=5)


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize(
    ("num_envs", "capacity", "steps", "end_prob"),
    [
        (1, 400, 300, 0.1),  # not wrapped, many episode boundaries
        (3, 48, 500, 0.15),  # wrapped many times over, interleaved envs
        (4, 4 * 64, 300, 0.5),  # very short episodes: stacks mostly padding
    ],
)
def test_samples_match_what_the_environment_showed(num_envs, capacity, steps, end_prob, n):
    """Stacks, actions and n-step returns, across episode ends (terminated and truncated) and
    the ring's wrap, as a person would compute them from the episodes."""
    rng = np.random.default_rng(0)
    envs = ReferenceEnvs(num_envs, rng)
    buffer = ReplayBuffer(SPEC, capacity, num_envs, "cpu", seed=1, n_step=n, gamma=0.9)
    fill(buffer, envs, steps, end_prob)
    seen = set(check_samples(buffer, envs, rounds=50, n=n, gamma=0.9))
    # Only transitions still in the buffer are sampled, and all of them can be.
    newest = envs.next_id
    per_env = capacity // num_envs
    assert min(seen) > newest - capacity - 3 * num_envs
    assert len(seen) > 0.5 * min(len(envs.transitions), per_env * num_envs)


def test_n_step_targets_by_hand():
    """One environment, gamma 0.5, n 3: a truncation after 2 steps, then a termination after 4;
    each target written out."""
    buffer = ReplayBuffer(SPEC, 64, 1, "cpu", seed=0, n_step=3, gamma=0.5)
    f = [frame(i, 0) for i in range(1, 12)]
    zero = np.zeros((2, 2), np.uint8)

    def obs(*frames):
        return np.stack([*(zero,) * (STACK - len(frames)), *frames])[None]

    no, yes = np.array([False]), np.array([True])
    buffer.add_first(obs(f[0]))
    # episode 1: f0 -(r=1)-> f1 -(r=2)-> f2, truncated (final obs f2); episode 2 starts at f3
    buffer.add([0], np.array([1.0], np.float32), no, no, obs(f[0], f[1]), None)
    buffer.add([1], np.array([2.0], np.float32), no, yes, obs(f[3]), obs(f[0], f[1], f[2]))
    # episode 2: f3 -(4)-> f4 -(8)-> f5 -(16)-> f6 -(32)-> f7, terminated
    rewards = [4.0, 8.0, 16.0, 32.0]
    for k, r in enumerate(rewards):
        term = yes if k == 3 else no
        nxt = obs(f[8]) if k == 3 else obs(*f[3 : 5 + k][-STACK:])
        final = obs(*f[3:8][-STACK:]) if k == 3 else None
        buffer.add([2 + k], np.array([r], np.float32), term, no, nxt, final)
    want = {  # first frame id -> (return, discount, bootstrap frame id)
        1: (1 + 0.5 * 2, 0.25, 3),  # cut by the truncation: bootstraps from the final obs f2
        2: (2, 0.5, 3),
        4: (4 + 0.5 * 8 + 0.25 * 16, 0.125, 7),
        5: (8 + 0.5 * 16 + 0.25 * 32, 0.0, None),  # terminated within the window
        6: (16 + 0.5 * 32, 0.0, None),
        7: (32, 0.0, None),
    }
    got = {}
    for _ in range(20):
        b = buffer.sample(16)
        for i in range(16):
            fid = frame_id(b.obs[i, -1].numpy())
            nxt = frame_id(b.next_obs[i, -1].numpy())
            got[fid] = (b.rewards[i].item(), b.discounts[i].item(), nxt if b.discounts[i] else None)
    assert got == want  # powers of two: exact in float32


def test_the_draw_is_uniform_over_valid_transitions():
    """The device sampler, run on the CPU: every valid start is drawn, as often as any other
    (a chi-square statistic far inside its range for a seeded run)."""
    envs = ReferenceEnvs(3, np.random.default_rng(11))
    buffer = ReplayBuffer(SPEC, 3 * 200, 3, "cpu", seed=4, n_step=3)
    fill(buffer, envs, 150, 0.05)  # not wrapped: every transition so far is in the ring
    valid = {f for f in envs.transitions if n_step_target(envs, f, 3, 0.99) is not None}
    seen = check_samples(buffer, envs, rounds=400, n=3)
    counts = np.array([seen.count(f) for f in sorted(valid)])
    assert set(seen) == valid
    expected = len(seen) / len(valid)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    df = len(valid) - 1
    assert abs(chi2 - df) < 5 * (2 * df) ** 0.5, (chi2, df)


def test_a_nearly_empty_replay_pads_the_batch_with_weight_zero():
    buffer = ReplayBuffer(SPEC, 64, 1, "cpu", seed=0, n_step=3)
    envs = ReferenceEnvs(1, np.random.default_rng(0))
    fill(buffer, envs, 4, 0.0)  # 5 slots written, of which 2 start 3 complete steps
    batch = buffer.sample(64)  # 144 draws: about 58 valid
    weights = batch.weights.numpy()
    assert 0 < weights.sum() < 64 and set(weights.tolist()) == {0.0, 1.0}
    drawn = {frame_id(batch.obs[i, -1].numpy()) for i in np.flatnonzero(weights)}
    assert drawn == {1, 2}


def test_the_async_guard_leaves_the_newest_and_oldest_slots_alone():
    envs = ReferenceEnvs(2, np.random.default_rng(2))
    buffer = ReplayBuffer(SPEC, 2 * 400, 2, "cpu", seed=0)
    fill(buffer, envs, 1000, 0.02)  # wrapped
    buffer.set_guard(True)
    guard = buffer.guard
    assert guard == 50  # an eighth of the 400 slots per environment
    for _ in range(30):
        b = buffer.sample(32)
        newest = [envs.next_id - 1 - e for e in range(2)]
        for i in range(32):
            fid = frame_id(b.obs[i, -1].numpy())
            age = min(abs(n - fid) for n in newest) // 2  # ids interleave over 2 envs
            assert guard - 2 <= age <= 400 - guard - STACK + 2


def test_stacks_never_cross_an_episode_start():
    rng = np.random.default_rng(3)
    envs = ReferenceEnvs(2, rng)
    buffer = ReplayBuffer(SPEC, 200, 2, "cpu", seed=0)
    fill(buffer, envs, 150, 0.3)
    batch = buffer.sample(256)
    for stack in batch.obs.numpy():
        ids = [frame_id(f) for f in stack]
        real = [i for i in ids if i]
        # real frames are the newest, consecutive within one env, with zeros only before them
        assert ids[-len(real) :] == real
        assert all(b > a for a, b in itertools.pairwise(real))


def test_vector_observations_round_trip():
    spec = EnvSpec("CartPole-v1", "vector", (4,), "float32", 2, ("l", "r"))
    buffer = ReplayBuffer(spec, 100, 1, "cpu", seed=0)
    obs = np.zeros((1, 4), np.float32)
    buffer.add_first(obs)
    for t in range(1, 50):
        nxt = np.full((1, 4), t, np.float32)
        done = np.array([t % 10 == 0])
        final = np.full((1, 4), 1000 + t, np.float32) if done.any() else None
        buffer.add(
            np.array([t % 2]), np.array([1.0], np.float32), done, np.array([False]), nxt, final
        )
    batch = buffer.sample(64)
    for o, n, d in zip(batch.obs, batch.next_obs, batch.discounts, strict=True):
        if d == 0:  # the last step of an episode leads to the final observation, not the reset one
            assert n[0].item() == 1000 + o[0].item() + 1
        else:
            assert n[0].item() == o[0].item() + 1
    assert batch.obs.dtype == torch.float32 and batch.obs.shape == (64, 4)


def test_an_atari_transition_costs_about_7_kb():
    per = bytes_per_transition(ATARI)
    assert per == 84 * 84 + 1 + 4 + 1
    assert per < 7.2 * 1024 < 28 * 1024  # the stacked layout stores at least 4 frames


def test_memory_plan_refuses_with_what_to_change():
    plan = plan_memory(ATARI, 1_000_000, available_bytes=2 * 1024**3, where="host")
    assert not plan.fits
    with pytest.raises(ReplayMemoryError) as e:
        plan.check()
    msg = str(e.value)
    assert "replay.capacity=1,000,000" in msg and "6.6 GiB" in msg and "2.0 GiB" in msg
    assert f"at most {plan.max_capacity:,}" in msg
    assert plan_memory(ATARI, plan.max_capacity, 2 * 1024**3, "host").fits
    assert not plan_memory(ATARI, plan.max_capacity + 1, 2 * 1024**3, "host").fits


def test_buffer_checks_memory_before_allocating():
    with pytest.raises(ReplayMemoryError):
        ReplayBuffer(ATARI, 10_000_000, 1, "cpu", available_bytes=100 * 1024**2)


def test_sampling_an_empty_buffer_is_an_error():
    buffer = ReplayBuffer(SPEC, 64, 1, "cpu")
    buffer.add_first(np.zeros((1, STACK, 2, 2), np.uint8))
    with pytest.raises(ValueError):
        buffer.sample(1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_an_unusable_gpu_is_one_sentence_not_a_traceback():
    with pytest.raises(DeviceError, match=r"cannot read the free memory of the CUDA GPU .*doctor"):
        available_memory(torch.device("cuda"))


def test_a_process_that_exits_while_its_replay_fills_exits_cleanly():
    """The replay commits its memory on a thread of its own; a process stopped during set-up
    exits while that fill runs. Killing the thread inside PyTorch at exit aborted the process
    ("terminate called without an active exception", 1 of 2 loaded suite runs): the fill stops
    between chunks once the main thread has ended, and the exit status is the program's."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from edgerl.envs import probe\n"
        "from edgerl.memories.replay import ReplayBuffer\n"
        "r = ReplayBuffer(probe('ALE/Pong-v5'), 300_000, 8, torch.device('cpu'), 0)\n"
        "assert r._filling is not None and r._filling.is_alive(), 'filled before the exit'\n"
        "sys.exit(3)\n"
    )
    for _ in range(3):  # the abort depended on timing: a few tries at it
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=600
        )
        assert out.returncode == 3, out.stderr
        assert "terminate called" not in out.stderr
