"""What `edgerl serve` costs the trainer: steps/s of a Pong run with no server, with a server and
no viewer, with 1 and with 20 viewers, each viewer streaming the game and polling the page's
documents as the page does (one run each, same machine, one after the other), then with no
server again: the two runs without one show how much the machine itself drifts.

    python scripts/bench_serve.py [--steps 8000] [--viewers 0,1,20] [--json]

Steps/s is measured from metrics.csv once learning has started, as scripts/bench_display.py does.
The viewers run in one process on this machine, at nice 10 like the server: on a board they
would be browsers elsewhere, so the figures here are the cost of the server and then some.
Also reported: the frames each viewer received per second, and the server's CPU time and memory.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LEARNING_STARTS = 1000
POLLS = {"summary": 2.0, "load": 3.0, "curves": 10.0}  # seconds, as the page polls


def edgerl(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgerl.cli", *args]


def train_cmd(run: Path, steps: int) -> list[str]:
    return edgerl(
        "train", "--env", "ALE/Pong-v5", "--steps", str(steps), "--run-dir", str(run), "--quiet",
        "--set", f"agent.learning_starts={LEARNING_STARTS}", "--set", "replay.capacity=20000",
        "--set", "train.log_every_s=2",
    )  # fmt: skip


def learning_sps(run: Path) -> float:
    """Steps/s between the first and last metrics rows after learning started (+1 interval)."""
    with (run / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if int(r["step"]) > LEARNING_STARTS * 1.5]
    first, last = rows[0], rows[-1]
    return (int(last["step"]) - int(first["step"])) / (
        float(last["wall_s"]) - float(first["wall_s"])
    )


# -- the viewers (a process of their own: --viewers-of URL) --------------------------------------


async def view(url: str, run: str, viewers: int) -> dict[str, float]:
    """``viewers`` pages watching ``run`` until SIGTERM: frames streamed (each answered once
    drawn, as the page does) and documents polled; returns what they received."""
    import aiohttp

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    frames = [0] * viewers
    documents = [0]

    async def stream(session: aiohttp.ClientSession, i: int) -> None:
        async with session.ws_connect(f"{url}api/runs/{run}/frames") as ws:
            while not stop.is_set():
                message = await ws.receive()
                if message.type == aiohttp.WSMsgType.BINARY:
                    frames[i] += 1
                    await ws.send_str("next")
                elif message.type != aiohttp.WSMsgType.TEXT:
                    return

    async def poll(session: aiohttp.ClientSession, what: str, every: float) -> None:
        etag = ""
        while not stop.is_set():
            async with session.get(
                f"{url}api/runs/{run}/{what}", headers={"If-None-Match": etag}
            ) as r:
                await r.read()
                etag = r.headers.get("ETag", "")
                documents[0] += 1
            await asyncio.sleep(every)

    started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.ensure_future(stream(session, i)) for i in range(viewers)]
        tasks += [
            asyncio.ensure_future(poll(session, what, every))
            for _ in range(viewers)
            for what, every in POLLS.items()
        ]
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    seconds = time.monotonic() - started
    return {
        "frames_per_s_per_viewer": round(sum(frames) / viewers / seconds, 2),
        "documents": documents[0],
        "seconds": round(seconds, 1),
    }


# -- the cases -------------------------------------------------------------------------------------


def start_server(root: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        # no token: its check is one HMAC a request, not what this measures, and the viewers
        # run in a process of their own
        edgerl("serve", "--run-dir", str(root), "--port", "0", "--trusted-network"),
        env={k: v for k, v in os.environ.items() if k != "EDGERL_SERVE_TOKEN"},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("edgerl serve: http://"):
        raise SystemExit(f"edgerl serve did not start: {line!r}")
    return proc, line.split()[2]


def run_case(viewers: int | None, steps: int) -> dict:
    """``viewers`` None: no server at all."""
    import psutil

    root = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    run = root / "Pong-v5"
    server, url = start_server(root) if viewers is not None else (None, "")
    trainer = subprocess.Popen(train_cmd(run, steps), stderr=subprocess.DEVNULL)
    watchers = None
    result: dict = {"case": "no server" if viewers is None else f"{viewers} viewers"}
    try:
        if viewers:
            while not (run / "display.json").exists() and trainer.poll() is None:
                time.sleep(0.1)
            me = [sys.executable, __file__, "--viewers-of", url, "--run", run.name]
            watchers = subprocess.Popen([*me, "--count", str(viewers)], stdout=subprocess.PIPE)
        trainer.wait()
        if watchers is not None:
            watchers.send_signal(signal.SIGTERM)
            out, _ = watchers.communicate(timeout=60)
            result.update(json.loads(out))
        if server is not None:
            used = psutil.Process(server.pid)
            cpu = used.cpu_times()
            result["server_cpu_s"] = round(cpu.user + cpu.system, 1)
            result["server_rss_mb"] = round(used.memory_info().rss / 2**20, 1)
    finally:
        for proc in (watchers, server):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
    result["steps_per_s"] = round(learning_sps(run), 2)
    result["run_dir"] = str(run)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8000)
    parser.add_argument("--viewers", default="0,1,20", help="viewer counts after the no-server run")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--viewers-of", help=argparse.SUPPRESS)  # the viewers' own process
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.viewers_of:
        os.nice(10)  # as the server: on a board the viewers would not be here at all
        print(json.dumps(asyncio.run(view(args.viewers_of, args.run, args.count))))
        return 0
    cases: list[int | None] = [None, *(int(v) for v in args.viewers.split(",")), None]
    results = [run_case(viewers, args.steps) for viewers in cases]
    base = results[0]["steps_per_s"]  # the first run without a server
    for r in results:
        r["vs_no_server"] = round(r["steps_per_s"] / base, 3)
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(
        f"{'case':12s} {'steps/s':>8s} {'vs none':>8s} {'frames/s each':>14s} {'server CPU':>11s}"
    )
    for r in results:
        fps, cpu = r.get("frames_per_s_per_viewer"), r.get("server_cpu_s")
        each = "" if fps is None else f"{fps:.1f}"
        used = "" if cpu is None else f"{cpu:.1f} s"
        print(
            f"{r['case']:12s} {r['steps_per_s']:8.1f} {r['vs_no_server']:8.3f} "
            f"{each:>14s} {used:>11s}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
