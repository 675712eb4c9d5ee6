"""``edgerl serve`` against real trainers (a live Pong run with its frame stream, a finished
CartPole run, a copy of it with damaged files), a real server process and a real headless
Chromium: the page, /metrics, the token, path traversal, slow viewers, a trainer restarted under
the server.

One Pong trainer and one server serve the whole module (the restart test comes last: it stops
and starts that trainer)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import http.client
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .conftest import PONG_FAST, edgerl_cmd

aiohttp = pytest.importorskip("aiohttp", reason="the web extra is not installed")
SLOW = 180.0  # generous: the CI machine has 2 busy cores


def wait_for(check: Callable[[], Any], what: str, timeout: float = SLOW) -> Any:
    """``check()``'s first true value, polled until ``timeout``; fails naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.2)


def child_env(root: Path) -> dict[str, str]:
    """The environment of the trainer and the servers: no token of the caller's own."""
    return {
        **{k: v for k, v in os.environ.items() if k != "EDGERL_SERVE_TOKEN"},
        "EDGERL_SYSTEM_CONFIG": "",
        "XDG_CACHE_HOME": str(root / "cache"),
        "PYTHONFAULTHANDLER": "1",
    }


@dataclass
class Trainer:
    """The module's Pong trainer, which the last test stops and starts again."""

    run: Path
    root: Path
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        args = [*PONG_FAST, "--steps", "10000000", "--run-dir", str(self.run), "--quiet"]
        args += ["--set", "display.every=1", "--set", "eval.every_steps=0"]
        with (self.root / "pong.log").open("ab") as log:
            self.proc = subprocess.Popen(
                edgerl_cmd("train", *args), stdout=log, stderr=log, env=child_env(self.root)
            )
        wait_for(lambda: (self.run / "display.json").exists() or self.proc.poll(), "Pong")
        assert self.proc.poll() is None, (self.root / "pong.log").read_text()[-3000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=SLOW)


@dataclass
class Served:
    root: Path  # the runs: Pong-v5 (live), CartPole-v1 (finished), damaged
    url: str  # http://127.0.0.1:PORT/
    token: str  # the one the server made for its start (it listens on 127.0.0.1)
    trainer: Trainer
    proc: subprocess.Popen

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        return request(self.url, path, headers, self.token)

    @property
    def auth(self) -> dict[str, str]:
        return bearer(self.token)


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def request(
    url: str, path: str, headers: dict[str, str] | None = None, token: str | None = None
) -> tuple[int, bytes]:
    """A GET of ``path`` exactly as written (no normalising of ``..``), with ``token`` as a
    Bearer unless ``headers`` say otherwise: (status, body)."""
    host, port = url.split("//")[1].rstrip("/").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("GET", path, headers={**bearer(token), **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def start_server(root: Path, *args: str) -> tuple[subprocess.Popen, str, str | None]:
    """``edgerl serve --run-dir ROOT --port 0 ARGS``, the address it says it serves and the
    token it says it made for this start (None where it was given one or none is wanted)."""
    log = (root / f"serve-{time.monotonic_ns()}.log").open("wb")
    proc = subprocess.Popen(
        edgerl_cmd("serve", "--run-dir", root, "--port", "0", *args),
        stdout=subprocess.PIPE,
        stderr=log,
        bufsize=0,  # read a byte at a time: select sees what a buffer would have hidden
        env=child_env(root),
    )
    line = read_line(proc.stdout, SLOW)
    assert line.startswith("edgerl serve: http://"), (line, Path(log.name).read_text())
    url = line.split()[2]
    if "--trusted-network" in args:
        return proc, url, None
    opened = read_line(proc.stdout, SLOW)  # printed with the first: the address with a token
    token = opened.split("?token=", 1)[1].split()[0] if opened.startswith("open http") else None
    return proc, url, token


def read_line(stream: Any, timeout: float) -> str:
    """A line from a child's unbuffered output, or what came of it within ``timeout``."""
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([stream], [], [], left)[0]:
            break
        byte = os.read(stream.fileno(), 1)
        if not byte:  # the server ended
            break
        data += byte
    return data.decode(errors="replace")


def stop_server(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60)


def damage(cartpole: Path, into: Path) -> None:
    """A copy of a run whose metrics.csv has damaged lines and whose status.json is no JSON."""
    shutil.copytree(cartpole, into, ignore=shutil.ignore_patterns("checkpoints", "replay"))
    lines = (into / "metrics.csv").read_bytes().splitlines(keepends=True)
    bad = [b"\xff\xfe\x00 not text\n", b"9" * (100 * 1024) + b"\n"]
    (into / "metrics.csv").write_bytes(b"".join(lines[:1] + bad + lines[1:]))  # after the header
    (into / "status.json").write_bytes(b"[" * 100_000)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("served")
    cartpole = root / "CartPole-v1"  # trained beside Pong's start-up: both take seconds
    args = ["--env", "CartPole-v1", "--steps", "1200", "--run-dir", cartpole, "--quiet"]
    args += ["--set", "agent.learning_starts=200", "--set", "eval.every_steps=300"]
    short = subprocess.Popen(
        edgerl_cmd("train", *args, "--set", "eval.episodes=1"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env(root), cwd=root,
    )  # fmt: skip
    trainer = Trainer(root / "Pong-v5", root)
    try:
        trainer.start()
        _, err = short.communicate(timeout=SLOW)
        assert short.returncode == 0, err[-3000:]
        damage(cartpole, root / "damaged")
        proc, url, token = start_server(root)
        assert token is not None  # on 127.0.0.1 without one: made for the start
        try:
            yield Served(root, url, token, trainer, proc)
        finally:
            assert stop_server(proc) == 0  # SIGTERM: a clean stop
    finally:
        trainer.stop()
        if short.poll() is None:
            short.kill()
            short.wait()


def status_json(run: Path) -> dict[str, Any]:
    return json.loads((run / "status.json").read_text())


def get_json(served: Served, path: str) -> dict[str, Any]:
    status, body = served.get(path)
    assert status == 200, body
    return json.loads(body)


# -- the page in a real browser -----------------------------------------------------------------

BROWSER_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1280,1000",
]  # fmt: skip


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[Any]:
    """The distribution's headless Chromium with a fresh profile, driven through its own
    chromedriver (Debian: apt-get install chromium chromium-driver; .ci/run does), or skip."""
    pytest.importorskip("selenium", reason="selenium is not installed (the test extra has it)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.skip("no Chromium and chromedriver here (Debian: apt-get install chromium "
                    "chromium-driver; .ci/run installs them)")  # fmt: skip
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in [*BROWSER_ARGS, f"--user-data-dir={profile}"]:
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()


def screenshot(chrome: Any, path: Path) -> None:
    """The whole page, beyond the window, as a PNG."""
    import base64

    width, height = chrome.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
    )
    clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
    shot = chrome.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.write_bytes(base64.b64decode(shot["data"]))


CANVAS_PIXELS = """
  const c = document.getElementById("game");
  const data = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  let sum = 0, distinct = new Set();
  for (let i = 0; i < data.length; i += 4) {
    sum = (sum * 31 + data[i]) % 1000000007;
    distinct.add(data[i]);
  }
  return [sum, distinct.size];
"""


def test_the_page_in_a_real_browser_shows_the_game_the_curves_and_the_load(served, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    with chromium(tmp_path / "profile") as chrome:
        js = chrome.execute_script
        count = lambda css: len(chrome.find_elements(By.CSS_SELECTOR, css))  # noqa: E731
        text = lambda css: chrome.find_element(By.CSS_SELECTOR, css).text  # noqa: E731
        frames = lambda: int(js("return document.body.dataset.frames || 0"))  # noqa: E731
        pick = lambda run: Select(chrome.find_element(By.ID, "run")).select_by_value(run)  # noqa: E731
        chrome.get(f"{served.url}?token={served.token}")  # the address it printed
        wait_for(lambda: "token" not in chrome.current_url, "the token out of the address bar")
        assert chrome.get_cookies() == []  # kept in the tab's sessionStorage, sent as a Bearer
        chrome.get(served.url + "#run=Pong-v5")
        wait_for(lambda: frames() >= 2, "frames on the page")
        first, distinct = js(CANVAS_PIXELS)
        assert distinct >= 3, "the game frame is blank"
        seen = frames()
        wait_for(lambda: frames() >= seen + 5, "more frames")
        wait_for(lambda: js(CANVAS_PIXELS)[0] != first, "a frame that changes")
        wait_for(lambda: count("#status dd") and count("#cores .core"), "the status and the cores")
        assert count("#sps path.line") == 1  # steps/s from metrics.csv
        assert text("#state") == "running"

        pick("CartPole-v1")  # a finished run on vector observations
        wait_for(lambda: count("#returns .evals circle") >= 2, "evaluations")
        assert count("#returns path.line") == 3  # returns, their mean, evaluations
        note = wait_for(lambda: js("return document.body.dataset.gameNote"), "a note")
        assert "vector observations" in note and "no frames" in note
        wait_for(lambda: text("#state") == "finished", "the finished state")

        pick("damaged")
        wait_for(lambda: "metrics.csv has 2 damaged lines" in text("#curves-notes"), "damage")
        assert "is damaged" in text("#notes")
        assert count("#returns path.line") >= 2  # drawn from what is left

        pick("Pong-v5")  # back: the game comes again
        wait_for(lambda: frames() >= 3 and count("#status dd"), "Pong again")
        with contextlib.suppress(AssertionError):  # a picture with Pong's first episodes
            wait_for(lambda: count("#returns path.line"), "returns", 20)
        screenshot(chrome, tmp_path / "serve.png")  # kept by the test run

        metrics = {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True}
        chrome.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)  # a phone
        chrome.refresh()
        wait_for(lambda: count("#status dd"), "the page on a phone")
        assert js("return document.documentElement.scrollWidth") <= 390, "wider than a phone"
        screenshot(chrome, tmp_path / "serve-phone.png")
        errors = [e["message"] for e in chrome.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors

        js("sessionStorage.clear()")  # a tab that was never given the token
        chrome.refresh()
        wait_for(lambda: "wants the token" in text("#problem"), "the page asking for the token")


# -- /metrics ------------------------------------------------------------------------------------


def scrape(served: Served) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    status, body = served.get("/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def test_metrics_parse_and_equal_status_json(served):
    pong = served.root / "Pong-v5"
    wait_for(lambda: (status_json(pong).get("load") or {}).get("cpu"), "a load sample")

    def consistent() -> tuple[dict[str, Any], dict] | None:
        before = status_json(pong)
        metrics = scrape(served)
        return (before, metrics) if status_json(pong) == before else None

    doc, metrics = wait_for(consistent, "a scrape between two writes of status.json")
    run = (("run", "Pong-v5"),)
    expected = {
        "edgerl_env_steps_total": doc["step"],
        "edgerl_env_steps_target": doc["total_steps"],
        "edgerl_env_steps_per_second": doc["sps"],
        "edgerl_episodes_total": doc["episodes"],
        "edgerl_updates_total": doc["updates"],
        "edgerl_epsilon": doc["epsilon"],
        "edgerl_status_updated_timestamp_seconds": doc["updated_unix"],
        "edgerl_trainer_running": 1,
        "edgerl_status_readable": 1,
    }
    for name, value in expected.items():
        assert metrics[(name, run)] == value, name
    if doc["return_mean"] is not None:
        assert metrics[("edgerl_training_return_mean", run)] == doc["return_mean"]
    load = doc["load"]
    for core, busy in enumerate(load["cpu"]):
        if busy is not None:
            assert metrics[("edgerl_cpu_busy_ratio", (("core", str(core)),))] == busy / 100
    assert metrics[("edgerl_memory_used_bytes", ())] == load["ram_used_mb"] * 2**20
    info = [k for k in metrics if k[0] == "edgerl_run_info" and ("run", "Pong-v5") in k[1]]
    assert info and ("learner", "dqn") in info[0][1] and ("env", "ALE/Pong-v5") in info[0][1]

    cartpole = status_json(served.root / "CartPole-v1")
    done = (("run", "CartPole-v1"),)
    assert metrics[("edgerl_env_steps_total", done)] == cartpole["step"] == 1200
    assert metrics[("edgerl_eval_return_mean", done)] == cartpole["eval_return"]
    assert metrics[("edgerl_trainer_running", done)] == 0
    evals = (served.root / "CartPole-v1" / "eval.csv").read_text().splitlines()[1:]
    best = max(float(line.split(",")[3]) for line in evals)
    assert metrics[("edgerl_eval_return_best", done)] == best
    assert metrics[("edgerl_status_readable", (("run", "damaged"),))] == 0
    # Every document has been read by now (the browser test's page): still no PyTorch in it.
    assert "torch" not in Path(f"/proc/{served.proc.pid}/maps").read_text()


# -- what may not happen --------------------------------------------------------------------------


def test_damaged_run_files_are_shown_as_damaged_never_a_500(served):
    summary = get_json(served, "/api/runs/damaged/summary")
    assert summary["status"] is None and "status.json is damaged" in summary["problem"]
    curves = get_json(served, "/api/runs/damaged/curves")
    assert curves["damage"] == [
        "metrics.csv has 2 damaged lines from line 2 on (not text, or over 64 KiB): skipped"
    ]
    assert len(curves["returns"]["y"]) > 10  # the rest is drawn
    assert served.get("/api/runs/no-such-run/summary")[0] == 404


def test_a_run_folder_whose_name_is_not_utf8_is_served_under_a_printable_id(served):
    """One such folder made every /metrics scrape a 500 (prometheus-client cannot encode the
    name) and its own summary a 404: its id writes the bytes that are not UTF-8 as \\xff."""
    raw = served.root / os.fsdecode(b"run-\xff\xfe")  # the bytes as the file system has them
    shutil.copytree(served.root / "CartPole-v1", raw, ignore=shutil.ignore_patterns("checkpoints"))
    try:
        ids = wait_for(
            lambda: [r["id"] for r in get_json(served, "/api/runs")["runs"] if "run-" in r["id"]],
            "the run listed",
        )
        assert ids == ["run-\\xff\\xfe"]
        status, body = served.get("/metrics")
        assert status == 200 and b'run="run-\\\\xff\\\\xfe"' in body, body[-500:]
        summary = get_json(served, "/api/runs/run-%5Cxff%5Cxfe/summary")
        assert summary["id"] == "run-\\xff\\xfe" and summary["env"] == "CartPole-v1"
    finally:
        shutil.rmtree(raw)
        wait_for(lambda: "run-" not in served.get("/api/runs")[1].decode(), "the run gone")


def test_viewers_learn_no_path_address_host_or_pid_of_the_board(served):
    """A run's documents say what it does, not where the board keeps it or which machines and
    processes run it: no absolute path in a sentence, no pid, and a fleet's actors without
    their nodes' addresses, host names or pids (a copy of the CartPole run made a fleet run)."""
    run = served.root / "fleet-run"
    shutil.copytree(served.root / "CartPole-v1", run)
    doc = status_json(run)
    doc["write_problems"] = [f"cannot write {run / 'metrics.csv'}: disk full"]
    doc["message"] = f"RunDirError: run directory {run} is held by pid 4243"
    doc["checkpoint_error"] = f"[Errno 28] No space left on device: '{run}/checkpoints/x.ckpt'"
    doc["fleet"] = {
        "actors": [
            {"id": 0, "state": "running", "node": "10.9.8.7", "node_id": "ab12cd",
             "host": "board-seven", "pid": 31337, "transitions": 5000, "sps": 812.5,
             "restarts": 0, "lost": None},
            {"id": 1, "state": "lost", "node": "10.9.8.6", "node_id": "ef34ab",
             "host": "board-six", "pid": 31338, "transitions": 100, "sps": 0.0,
             "restarts": 1, "lost": "node 10.9.8.6 (board-six) stopped answering"},
        ],
        "running": 1, "transitions": 5100, "weights_lag_max": 3, "address": "10.9.8.1:6379",
    }  # fmt: skip
    (run / "status.json").write_text(json.dumps(doc))
    listed = lambda: any(r["id"] == "fleet-run" for r in get_json(served, "/api/runs")["runs"])  # noqa: E731
    wait_for(listed, "the new run listed")
    seen = {
        (name, what): served.get(f"/api/runs/{name}/{what}")[1].decode()
        for name in ("fleet-run", "damaged", "Pong-v5")
        for what in ("summary", "curves")
    }
    for secret in (str(served.root), "10.9.8", "board-s", "ab12cd", "pid"):
        assert not any(secret in body for body in seen.values()), secret
    for pid in ("31337", "31338", "4243"):  # as numbers: Pong's curves hold digits like 42436
        assert not any(re.search(rf"(?<![\d.]){pid}(?![\d.])", b) for b in seen.values()), pid
    fleet = get_json(served, "/api/runs/fleet-run/summary")["status"]["fleet"]
    states = [(a["state"], a["lost"]) for a in fleet["actors"]]
    assert states == [("running", False), ("lost", True)]
    assert fleet["transitions"] == 5100
    summary = get_json(served, "/api/runs/fleet-run/summary")
    assert summary["status"]["write_problems"] == ["cannot write metrics.csv: disk full"]
    message = "RunDirError: run directory fleet-run is held by the trainer"
    assert summary["status"]["message"] == message
    assert "the trainer" in get_json(served, "/api/runs/Pong-v5/summary")["live"]["reason"]


def test_folders_with_spaces_and_a_lying_fleet_reach_viewers_as_names_and_bounded_counts(served):
    """A second server over ``My Runs``: the sentences of its run ``secret project`` keep
    nothing of the folders above it (a path with spaces left ``Runs/secret project/...``), and a
    fleet whose fields are not the trainer's (a count of 10^30, a state of markup, an object for
    a rate) is shown as unknown, not passed on (issue 58)."""
    root = served.root / "My Runs"
    run = root / "secret project"
    shutil.copytree(served.root / "CartPole-v1", run, ignore=shutil.ignore_patterns("checkpoints"))
    doc = status_json(run)
    doc["message"] = f"RunDirError: cannot write {run / 'checkpoints' / 'ckpt-1.ckpt'}: disk full"
    doc["write_problems"] = [f"cannot write {run}/metrics.csv: disk full"]
    doc["fleet"] = {
        "running": 10**30, "transitions": -4, "weights_lag_max": "many",
        "actors": [
            {"id": "<script>", "state": "<b>running</b>", "transitions": 1.5,
             "sps": {"a": 1}, "restarts": True, "lost": None},
            {"id": 1, "state": "lost", "transitions": 100, "sps": 12.5, "restarts": 2,
             "lost": "its node died"},
        ],
    }  # fmt: skip
    (run / "status.json").write_text(json.dumps(doc))
    proc, url, token = start_server(root)
    try:
        status, body = request(url, "/api/runs/secret%20project/summary", token=token)
    finally:
        assert stop_server(proc) == 0
    assert status == 200, body
    text = body.decode()
    summary = json.loads(text)["status"]
    assert "My Runs" not in text and "Runs/" not in text and str(served.root) not in text
    assert summary["message"] == "RunDirError: cannot write checkpoints/ckpt-1.ckpt: disk full"
    assert summary["write_problems"] == ["cannot write metrics.csv: disk full"]
    fleet = summary["fleet"]
    assert (fleet["running"], fleet["transitions"], fleet["weights_lag_max"]) == (None,) * 3
    assert fleet["actors"] == [
        {"id": None, "state": "unknown", "transitions": None, "sps": None, "restarts": None,
         "lost": False},
        {"id": 1, "state": "lost", "transitions": 100, "sps": 12.5, "restarts": 2, "lost": True},
    ]  # fmt: skip


@pytest.mark.parametrize(
    "path",
    [
        "/assets/../../../../etc/passwd",
        "/assets/%2e%2e%2f%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "/assets/..%2f__init__.py",
        "/assets/%2fetc%2fpasswd",
        "/api/runs/..%2f..%2f..%2fetc/summary",
        "/api/runs/%2e%2e/curves",
        "/../../etc/passwd",
        "/assets/app.py",
    ],
)
def test_no_request_path_reaches_the_file_system(served, path):
    status, body = served.get(path)
    assert status in (400, 404), (status, body[:200])
    assert b"root:" not in body and b"import" not in body


def test_slow_and_silent_viewers_never_stall_the_others(served):
    host, port = served.url.split("//")[1].rstrip("/").rsplit(":", 1)

    async def silent_viewer() -> asyncio.StreamWriter:
        """Asks for the frames, then never reads a byte (a phone that went to sleep)."""
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"GET /api/runs/Pong-v5/frames HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer "
            + served.token.encode()
            + b"\r\n\r\n"
        )
        await writer.drain()
        return writer

    async def watch() -> int:
        silent = [await silent_viewer() for _ in range(8)]
        async with aiohttp.ClientSession(headers=served.auth) as session:
            lagging = await session.ws_connect(served.url + "api/runs/Pong-v5/frames")
            assert (await lagging.receive(timeout=SLOW)).type  # one frame, never answered
            async with session.ws_connect(served.url + "api/runs/Pong-v5/frames") as ws:
                got = 0
                while got < 20:
                    message = await ws.receive(timeout=SLOW)
                    if message.type == aiohttp.WSMsgType.BINARY:
                        (length,) = struct.unpack_from("<I", message.data)
                        assert message.data[4 + length :].startswith(b"\x89PNG")
                        got += 1
                        await ws.send_str("next")
            async with session.get(served.url + "api/runs") as response:
                assert response.status == 200
            await lagging.close()
        for writer in silent:
            writer.close()
        return got

    assert asyncio.run(watch()) == 20


def test_a_run_shows_only_its_owners_game(served, tmp_path):
    """A display.json may name any run's frame stream. A run whose display.json is a link to
    Pong's, or (as root) another account's run whose display.json names Pong's stream, is sent
    no frame of it, and its page says why; Pong itself is streamed by the same server."""
    pong = served.root / "Pong-v5"
    root = tmp_path / "runs"
    root.mkdir()
    linker = root / "linker"
    linker.mkdir(mode=0o750)
    (linker / "status.json").write_bytes((pong / "status.json").read_bytes())
    (linker / "display.json").symlink_to(pong / "display.json")
    hostile = {"linker": "symbolic link"}
    if os.geteuid() == 0:
        thief = root / "thief"
        thief.mkdir(mode=0o750)
        for name in ("status.json", "display.json"):
            (thief / name).write_bytes((pong / name).read_bytes())
        for path in (thief, thief / "status.json", thief / "display.json"):
            os.chown(path, 65534, 65534)
        hostile["thief"] = "not shown"
    proc, url, token = start_server(root, "--run-dir", pong)

    async def watch(run: str, refusal: str | None) -> tuple[list[str], int]:
        """The notes and the number of frames the run's stream sends: until its refusal has
        been said and a few seconds more, or until frames come (Pong's)."""
        notes: list[str] = []
        frames, loop = 0, asyncio.get_running_loop()
        deadline = loop.time() + SLOW
        session = aiohttp.ClientSession(headers=bearer(token))
        async with session, session.ws_connect(url + f"api/runs/{run}/frames") as ws:
            while loop.time() < deadline and frames < 3:
                try:
                    message = await ws.receive(timeout=max(deadline - loop.time(), 0.1))
                except asyncio.TimeoutError:
                    break
                if message.type == aiohttp.WSMsgType.BINARY:
                    frames += 1
                    await ws.send_str("next")
                elif message.type == aiohttp.WSMsgType.TEXT:
                    notes.append(json.loads(message.data)["note"])
                    if refusal is not None and refusal in notes[-1]:
                        deadline = min(deadline, loop.time() + 5.0)
                else:
                    break
        return notes, frames

    try:
        for run, refusal in hostile.items():
            notes, frames = asyncio.run(watch(run, refusal))
            assert frames == 0 and any(refusal in n for n in notes), (run, frames, notes)
            assert not any(str(pong) in n for n in notes), notes
        assert asyncio.run(watch("Pong-v5", None))[1] == 3
    finally:
        assert stop_server(proc) == 0


# -- who may connect ----------------------------------------------------------------------------


def test_beyond_this_machine_a_token_is_wanted(served, cli, tmp_path):
    r = cli("serve", "--host", "0.0.0.0", "--run-dir", served.root)
    assert r.code == 2 and "wants a token" in r.err and "--trusted-network" in r.err
    short = tmp_path / "short"
    short.write_text("abc\n")
    r = cli("serve", "--host", "0.0.0.0", "--token-file", short)
    assert r.code == 2 and "at least 16 characters" in r.err
    token = "s3cret-token-for-the-test-0123456789"
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "token").chmod(0o644)  # others may read it: said, as ssh says of its keys
    proc, url, _ = start_server(
        served.root, "--host", "0.0.0.0", "--token-file", tmp_path / "token"
    )
    try:
        local = url.replace("0.0.0.0", "127.0.0.1")
        for path in ("/api/runs", "/metrics", "/api/runs/Pong-v5/summary"):
            assert request(local, path)[0] == 401, path
        for path in ("/", "/assets/app.js"):  # the page's own files: no run in them
            assert request(local, path)[0] == 200, path
        status, said = request(local, "/metrics", {"Authorization": "Bearer wrong-0123456789"})
        assert status == 401 and b"is not this edgerl serve's" in said
        status, said = request(local, "/api/runs/Pong-v5/frames?token=wrong-token-0123456789")
        assert status == 401 and b"is not this edgerl serve's" in said
        status, said = request(local, "/metrics")  # none shown: it is wanted
        assert b"edgerl serve wants a token" in said and b"not this" not in said
        assert request(local, "/metrics", {"Authorization": f"Bearer {token}"})[0] == 200
        # No cookie is set or taken: a browser sends a host's cookies to every port of it,
        # where another account's server could take one and replay it here.
        conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1].strip("/")))
        conn.request("GET", f"/?token={token}")
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("Set-Cookie") is None
        old = hmac.new(token.encode(), b"edgerl serve cookie v1", hashlib.sha256).hexdigest()
        for cookie in (f"edgerl_token={token}", f"edgerl_token={old}", f"token={token}"):
            assert request(local, "/api/runs", {"Cookie": cookie})[0] == 401
        # ?token= is taken by the frame stream alone (a WebSocket takes no header)
        assert request(local, f"/api/runs?token={token}")[0] == 401
        assert request(local, f"/api/runs/Pong-v5/frames?token={token}")[0] == 400  # no upgrade
        assert request(local, "/api/runs/Pong-v5/frames?token=wrong-token-0123456789")[0] == 401
        # a Bearer that is not UTF-8 is a wrong token: 401, never a 500
        status = raw_status(local, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                            b"Authorization: Bearer \xff\xfe\xfd-not-text\r\n\r\n")  # fmt: skip
        assert status == 401
        log = max(served.root.glob("serve-*.log"), key=lambda f: f.stat().st_mtime)
        assert "may be read by other users (mode 0644)" in log.read_text()
    finally:
        assert stop_server(proc) == 0


def test_on_this_machine_too_other_accounts_need_the_token_made_for_the_start(served):
    """Other accounts of the machine are kept out of the run directories (0750): the page on
    127.0.0.1 must not let them in. Without a token file, each start makes a token and prints
    the address with it; nothing is served without it."""
    for path in ("/api/runs", "/metrics", "/api/runs/Pong-v5/summary"):
        assert request(served.url, path)[0] == 401, path
    assert served.get("/api/runs")[0] == 200 and served.get("/metrics")[0] == 200
    assert len(served.token) >= 32
    proc, url, token = start_server(served.root)  # another start: another token
    try:
        assert token not in (None, served.token)
        assert request(url, "/api/runs", token=served.token)[0] == 401
        assert request(url, "/api/runs", token=token)[0] == 200
    finally:
        assert stop_server(proc) == 0
    # --trusted-network on 127.0.0.1: no token (every account may watch), and only this
    # machine's own names, so that no web page elsewhere reaches it (DNS rebinding)
    proc, url, token = start_server(served.root, "--trusted-network")
    try:
        assert token is None
        assert request(url, "/", {"Host": "attacker.example"})[0] == 403
        assert request(url, "/", {"Host": "localhost:1234"})[0] == 200
        assert request(url, "/", {"Host": "localhost:99999"})[0] == 403  # no port: no 500
    finally:
        assert stop_server(proc) == 0


def raw_status(url: str, data: bytes) -> int:
    """The status line's code of a request sent as raw bytes."""
    host, port = url.split("//")[1].strip("/").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(data)
        return int(conn.recv(4096).split(b" ")[1])


def test_silent_and_half_sent_connections_are_closed(served):
    """Before any token is asked for, a connection holds a socket: one that sends nothing, or
    a request's first lines and no more, is closed after TOKEN_S (aiohttp kept both an hour).
    More of them, and other accounts': tests/test_serve_connections.py."""
    from edgerl.serve.server import TOKEN_S

    host, port = served.url.split("//")[1].strip("/").rsplit(":", 1)
    silent = socket.create_connection((host, int(port)), timeout=10 * TOKEN_S)
    half = socket.create_connection((host, int(port)), timeout=10 * TOKEN_S)
    try:
        half.sendall(b"GET /api/runs HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        opened = time.monotonic()
        assert silent.recv(1) == b"" and half.recv(1) == b""  # closed by the server
        assert time.monotonic() - opened >= TOKEN_S * 0.5  # by its rule, not at once
    finally:
        silent.close()
        half.close()
    assert served.get("/api/runs")[0] == 200  # and the page answers as before


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        (("192.0.2.7", 5000), "192.0.2.7"),
        (("2001:db8:1:2:aaaa::1", 5000, 0, 0), "2001:db8:1:2::/64"),
        (("2001:db8:1:2:ffff::9", 5001, 0, 0), "2001:db8:1:2::/64"),  # the same host's /64
        (("::ffff:192.0.2.7", 5000, 0, 0), "192.0.2.7"),  # IPv4 on a dual-stack socket
        (("fe80::1%eth0", 5000, 0, 2), "fe80::/64"),
        (None, "?"),
    ],
)
def test_a_connection_counts_against_its_address_or_its_ipv6_64(peer, key):
    from edgerl.serve.peers import peer_key

    assert peer_key(peer) == key


def test_malformed_requests_are_one_line_in_the_log_not_a_traceback_each(served):
    """aiohttp answered each with 400 and logged a traceback at ERROR: anyone could fill the
    journal. Now: 400, and one INFO line a minute with the count."""
    logs_before = set(served.root.glob("serve-*.log"))
    proc, url, token = start_server(served.root)
    (log_file,) = set(served.root.glob("serve-*.log")) - logs_before  # this server's alone
    try:
        for junk in (
            b"\x16\x03\x01 a TLS hello on the HTTP port\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: localhost\r\nBad Header\r\n\r\n",
            b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n",
        ):
            assert raw_status(url, junk) == 400
        assert request(url, "/api/runs", token=token)[0] == 200
    finally:
        assert stop_server(proc) == 0
    log = log_file.read_text()
    assert "Traceback" not in log and "ERROR" not in log, log
    assert log.count("malformed in the last minute, refused") == 1, log


def test_a_trusted_network_answers_to_this_machines_names_and_the_allowed_ones(served):
    """--trusted-network wants no token, so its Host check is what keeps a web page elsewhere
    from reading the runs through a name of its own (DNS rebinding)."""
    proc, url, _ = start_server(
        served.root, "--host", "0.0.0.0", "--trusted-network", "--allowed-host", "Board.LAN"
    )
    try:
        local = url.replace("0.0.0.0", "127.0.0.1")
        assert request(local, "/api/runs", {"Host": "attacker.example"})[0] == 403
        assert request(local, "/api/runs", {"Host": "attacker.example:8765"})[0] == 403
        port = url.rstrip("/").rsplit(":", 1)[1]
        assert request(local, "/api/runs", {"Host": f"127.0.0.1:{port}"})[0] == 200
        assert request(local, "/api/runs", {"Host": socket.gethostname()})[0] == 200
        assert request(local, "/api/runs", {"Host": "board.lan:8765"})[0] == 200
    finally:
        assert stop_server(proc) == 0


def test_a_port_in_use_is_one_sentence(cli, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = cli("serve", "--run-dir", tmp_path, "--port", taken.getsockname()[1])
    assert r.code == 2 and "something else listens there already" in r.err
    assert "Traceback" not in r.err


def test_without_the_web_extra_serve_says_how_to_install_it(cli, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "aiohttp", None)
    r = cli("serve", "--run-dir", tmp_path)
    assert r.code == 2 and "pip install 'edgerl[web]'" in r.err


def test_nothing_outside_serve_imports_the_web_extra():
    code = (
        "import sys, edgerl.cli; print(sorted({'aiohttp', 'prometheus_client'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr
    package = Path(__file__).resolve().parents[1] / "edgerl"
    for path in package.rglob("*.py"):
        if "serve" not in path.relative_to(package).parts:
            text = path.read_text()
            assert "aiohttp" not in text and "prometheus_client" not in text, path


# -- last: the trainer restarted under the server ----------------------------------------------


def test_the_page_follows_a_trainer_restarted_under_it(served):
    async def watch() -> tuple[dict[str, Any], str, dict[str, Any]]:
        url = served.url + "api/runs/Pong-v5/frames"
        session = aiohttp.ClientSession(headers=served.auth)
        async with session, session.ws_connect(url) as ws:

            async def next_message(want: aiohttp.WSMsgType) -> Any:
                """The next message of kind ``want``; each frame on the way answered."""
                while True:
                    message = await ws.receive(timeout=SLOW)
                    assert message.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY)
                    if message.type == aiohttp.WSMsgType.BINARY:
                        await ws.send_str("next")
                        if want == message.type:
                            (length,) = struct.unpack_from("<I", message.data)
                            return json.loads(message.data[4 : 4 + length])
                    elif want == message.type:
                        return json.loads(message.data)["note"]

            before = await next_message(aiohttp.WSMsgType.BINARY)
            # The trainer stops and starts on a thread while this socket keeps receiving: the
            # server's heartbeat wants its pongs, which aiohttp sends only from receive() (a
            # loaded machine takes minutes to start a trainer).
            stopping = asyncio.ensure_future(asyncio.to_thread(served.trainer.stop))
            note = ""
            while "no trainer is running" not in note:  # said on the same socket
                note = await next_message(aiohttp.WSMsgType.TEXT)
            await stopping
            starting = asyncio.ensure_future(asyncio.to_thread(served.trainer.start))
            after = await next_message(aiohttp.WSMsgType.BINARY)
            await starting
            return before, note, after

    before, note, after = asyncio.run(watch())
    assert "the run stopped at" in note, note
    # Viewers learn the run's name, never where the board keeps it or its trainer's pid.
    assert str(served.root) not in note and "pid" not in note, note
    assert after["step"] > before["step"]  # the run resumed: its steps go on
    summary = wait_for(
        lambda: (s := get_json(served, "/api/runs/Pong-v5/summary"))["live"]["running"] and s,
        "the restarted trainer's status",
    )
    assert summary["problem"] is None and summary["status"]["step"] >= after["step"] - 10_000


# -- the board's metrics from a real Orin line, and a load record of a damaged file --------------


def test_board_metrics_of_an_orin_are_its_tegrastats_figures_in_base_units():
    from prometheus_client.core import Metric

    from edgerl.hw.tegrastats import parse_line
    from edgerl.serve.exporter import board_metrics
    from edgerl.serve.runs import clean_load

    line = (Path(__file__).parent / "fixtures/tegrastats/agx_orin_jp6.txt").read_text()
    record = parse_line(line.splitlines()[0])
    assert record is not None
    families: list[Metric] = list(
        board_metrics(clean_load(json.loads(json.dumps(record.to_dict()))))
    )
    got = {(s.name, tuple(s.labels.values())): s.value for f in families for s in f.samples}
    assert got[("edgerl_cpu_busy_ratio", ("5",))] == 1.0
    assert got[("edgerl_cpu_frequency_hertz", ("4",))] == 2201 * 10**6
    assert got[("edgerl_emc_busy_ratio", ())] == 0.01
    assert got[("edgerl_gpu_frequency_hertz", ())] == 305 * 10**6
    assert got[("edgerl_temperature_celsius", ("tj",))] == 53.062
    assert got[("edgerl_power_watts", ("VIN_SYS_5V0",))] == 4.767
    assert got[("edgerl_memory_used_bytes", ())] == 29114 * 2**20


@pytest.mark.parametrize(
    "record",
    [
        [], None, "text", {"cpu": "x", "temps": [1], "power_mw": {"VDD_IN": float("nan")}},
        {"cpu": [1e999, None, "7", True], "gr3d": "31", "temps": {"tj\x1b[2J": 50.0, "cpu": 1e999}},
    ],
)  # fmt: skip
def test_a_load_record_of_a_damaged_status_gives_only_finite_numbers(record):
    from edgerl.serve.exporter import board_metrics
    from edgerl.serve.runs import clean_load

    load = clean_load(record)
    if load is None:
        assert not isinstance(record, dict)
        return
    assert load["cpu"] in ([], [None, None, None, None]) and load["gr3d"] is None
    assert load["temps"] == {} and load["power_mw"] == {}
    assert all(s.value == s.value for f in board_metrics(load) for s in f.samples)


def test_a_browser_closing_the_page_is_no_error(caplog):
    """A handler whose client went away (ConnectionResetError while it writes) is left to
    aiohttp, which drops the connection quietly: no traceback at ERROR, no 500 written."""
    import asyncio
    import logging

    from aiohttp.test_utils import make_mocked_request

    from edgerl.serve import ServeOptions
    from edgerl.serve.app import SERVED, Served, guard

    request = make_mocked_request("GET", "/api/runs", headers={"Host": "127.0.0.1:8765"})
    opts = ServeOptions(roots=[], host="127.0.0.1", port=0, token=None)
    request.app[SERVED] = Served(opts, None, None)  # type: ignore[arg-type]

    async def gone(_request):
        raise ConnectionResetError("Cannot write to closing transport")

    with caplog.at_level(logging.DEBUG, logger="edgerl.serve"), pytest.raises(ConnectionResetError):
        asyncio.run(guard(request, gone))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_base64_token_in_the_frame_streams_address_is_read_back(served, tmp_path):
    """`head -c 24 /dev/urandom | base64` makes a token with + about 40% of the time; an
    address reads + as a space. Given as it is, or written %2B, the frame stream takes it (the
    page reads its own address's spaces back as + too); a wrong token still does not."""
    token = "s3cret+token/for+the+test+0123456789=="
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "token").chmod(0o600)
    proc, url, _ = start_server(
        served.root, "--host", "0.0.0.0", "--token-file", tmp_path / "token"
    )
    try:
        port = int(url.rsplit(":", 1)[1].strip("/"))
        frames = "/api/runs/Pong-v5/frames"
        for given in (token, token.replace("+", "%2B").replace("/", "%2F"), token + "x"):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("GET", f"{frames}?token={given}")
            status = conn.getresponse().status
            assert status == (401 if given.endswith("x") else 400), given  # 400: no upgrade
        assert request(url.replace("0.0.0.0", "127.0.0.1"), f"{frames}?token=")[0] == 401
    finally:
        assert stop_server(proc) == 0
