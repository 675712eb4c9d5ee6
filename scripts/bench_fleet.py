"""Throughput across the fleet's boundary: remote actors on a second Ray node stepping Pong and
sending batches of single frames, the learner receiving them and writing its replay (no
learning, so that the boundary is what is measured). Also the cluster's start time and memory,
and the time to send the Nature CNN's weights to every actor.

python scripts/bench_fleet.py [--actors 2] [--envs 8] [--batch-steps 32] [--seconds 20]
                              [--greedy | --resend] [--env ALE/Pong-v5]

``--resend``: each actor collects one real batch and then sends it again and again, without
emulating: the boundary's own limit (serialising, the object store, the learner receiving and
writing its replay) rather than the actors' emulation.

Both nodes run on this machine (``ray.cluster_utils.Cluster``: a head node for the learner to
join and a worker node with ``--actors`` CPUs), so the figures are those of the transport, not of
a network; docs/fleet.md turns them into a scaling model.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import sys
import tempfile
import time

import numpy as np
import psutil


def pss_mib(procs: list[psutil.Process]) -> float:
    total = 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total / 2**20


def cluster_processes(cluster) -> list[psutil.Process]:  # type: ignore[no-untyped-def]
    found = []
    for node in cluster.list_all_nodes():
        for infos in node.all_processes.values():
            for info in infos:
                try:
                    proc = psutil.Process(info.process.pid)
                    found += [proc, *proc.children(recursive=True)]
                except psutil.NoSuchProcess:
                    continue
    return found


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--envs", type=int, default=8, help="environments per actor")
    ap.add_argument("--batch-steps", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--greedy", action="store_true", help="actors act with their network")
    ap.add_argument("--resend", action="store_true", help="actors resend one batch")
    ap.add_argument("--env", default="ALE/Pong-v5")
    args = ap.parse_args(argv)

    temp = tempfile.mkdtemp(prefix="edgerl-bf-", dir="/tmp")
    os.environ.update(
        RAY_TMPDIR=temp,
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(32),
        RAY_USAGE_STATS_ENABLED="0",
    )
    from ray.cluster_utils import Cluster

    import edgerl.fleet.transport
    from edgerl.config import build_layers, resolve
    from edgerl.envs import probe
    from edgerl.fleet import open_fleet
    from edgerl.fleet.actor import RemoteActor
    from edgerl.learners.factory import q_network
    from edgerl.memories.replay import ReplayBuffer
    from edgerl.report.episodes import Episodes
    from edgerl.run.remote import write_chunk

    if args.resend:

        class Resending(RemoteActor):  # sent to the workers by value (defined in __main__)
            def collect(self, steps, epsilons, weights=None, version=-1):  # type: ignore[no-untyped-def]
                if not hasattr(self, "batch"):
                    self.batch = super().collect(steps, epsilons, weights, version)
                    return self.batch
                return self.batch._replace(first=None)

        edgerl.fleet.transport.RemoteActor = Resending  # type: ignore[misc]

    started = time.perf_counter()
    node = {"object_store_memory": 200 << 20, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "num_cpus": 1})
    worker = {"num_cpus": args.actors, "resources": {"bench": args.actors}}
    cluster.add_node(object_store_memory=200 << 20, **worker)
    cluster_s = time.perf_counter() - started
    out: dict[str, float | int | str] = {"cluster_start_s": round(cluster_s, 2)}
    transport = None
    try:
        out["cluster_pss_mib"] = round(pss_mib(cluster_processes(cluster)), 0)
        total = args.actors * args.envs
        sets = [
            f"fleet.actors={args.actors}",
            f"fleet.address={cluster.address}",
            "fleet.resource=bench",
            f"fleet.batch_steps={args.batch_steps}",
            f"env.num_envs={args.envs}",
            f"replay.capacity={max(100_000, total * 64)}",
        ]
        cfg = resolve(build_layers(None, sets, {"env.id": args.env}, use_system=False))
        spec = probe(args.env)
        transport = open_fleet(cfg, spec)
        net = q_network(cfg, spec)
        weights = {k: v.numpy() for k, v in net.state_dict().items()}
        replay = ReplayBuffer(spec, cfg.replay.capacity, total)

        class Learner:  # the trainer's part that write_chunk drives: the replay writes
            step = 0
            episode_tally = Episodes()

            def _record(self, actions, result, envs):  # type: ignore[no-untyped-def]
                replay.add(
                    actions,
                    result.rewards,
                    result.terminated,
                    result.truncated,
                    result.obs,
                    result.final_obs,
                    envs=envs,
                )
                self.step += len(actions)

        run = Learner()
        run.cfg, run.spec, run.memory = cfg, spec, replay  # type: ignore[attr-defined]
        run.episode_tally.start(total, 0, None)
        transport.start(weights, 0, seed=0)
        transport.set_exploration(np.full(total, 0.01 if args.greedy else 1.0))

        def pump(seconds: float) -> tuple[int, int, float, float]:
            """Transitions and bytes received and written in ``seconds``, the wall and the
            learner's CPU seconds."""
            steps = nbytes = 0
            t0, cpu0 = time.perf_counter(), time.process_time()
            while time.perf_counter() - t0 < seconds:
                for chunk in transport.receive(0.25):
                    write_chunk(run, chunk, 10**12)  # type: ignore[arg-type]
                    steps += chunk.steps
                    nbytes += sum(a.nbytes for a in chunk if isinstance(a, np.ndarray))
            return steps, nbytes, time.perf_counter() - t0, time.process_time() - cpu0

        first = time.perf_counter()
        while transport.status()["running"] < args.actors:
            pump(0.5)
        out["actors_up_s"] = round(time.perf_counter() - first, 2)
        pump(3.0)  # warm
        steps, nbytes, wall, cpu = pump(args.seconds)
        out.update(
            transitions_per_s=round(steps / wall),
            mb_per_s=round(nbytes / wall / 1e6, 1),
            bytes_per_transition=round(nbytes / max(steps, 1)),
            learner_cpu_share=round(cpu / wall, 2),
            learner_cpu_us_per_transition=round(cpu / max(steps, 1) * 1e6, 1),
        )
        ray = transport.ray  # type: ignore[attr-defined]
        handles = [slot.handle for slot in transport.slots]  # type: ignore[attr-defined]
        times = []
        for version in range(1, 6):
            t0 = time.perf_counter()
            ref = ray.put(weights)
            ray.get([h.set_weights.remote(ref, version) for h in handles])
            times.append(time.perf_counter() - t0)
        out["weights_mb"] = round(sum(v.nbytes for v in weights.values()) / 1e6, 1)
        out["weights_to_all_actors_ms"] = round(float(np.median(times)) * 1e3, 1)
        out["all_pss_mib"] = round(pss_mib(cluster_processes(cluster)), 0)
        out.update(actors=args.actors, envs_per_actor=args.envs, env=args.env)
        out.update(batch_steps=args.batch_steps, greedy=int(args.greedy), resend=int(args.resend))
    finally:
        if transport is not None:
            transport.close()
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main(sys.argv[1:]))
