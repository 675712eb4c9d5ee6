"""Every file edgerl reads may be damaged: side files never stop a resume or the service, and every
reader of a run file ends damaged input in one sentence and a non-zero exit, never an internal
error and never a hang. The damage is generated (tests/damage.py)."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from edgerl.cli import main

from .conftest import run_edgerl
from .damage import HUGE_CELL, RANDOM_4K, WRONG_DOCUMENTS, damaged_csv, damaged_json
from .test_viewer import _set_header, lookalike_trainer, ring_with_live_pid  # noqa: F401 - a fixture

CARTPOLE = ["--env", "CartPole-v1", "--set", "eval.every_steps=500", "--set", "eval.episodes=2"]


def run_cli(*args: object) -> tuple[int, str, str]:
    """``edgerl ARGS`` in-process (for Hypothesis, which runs a test many times over)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def one_sentence(code: int, err: str) -> None:
    assert code != 0 and "internal error" not in err and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgerl: error: "), err


def test_damaged_side_files_never_stop_a_resume_or_the_service(cli, tmp_path):
    run = tmp_path / "cp"
    assert cli("train", *CARTPOLE, "--run-dir", run, "--steps", "1000", "--quiet").code == 0
    for name in ("metrics.csv", "eval.csv", "episodes.csv", "load.csv"):
        with (run / name).open("ab") as f:
            f.write(RANDOM_4K + HUGE_CELL)
    r = cli("train", *CARTPOLE, "--run-dir", run, "--steps", "1500", "--quiet")
    assert r.code == 0 and "internal error" not in r.err, r.err[-2000:]
    assert r.err.count(f"{run / 'eval.csv'} has ") == 1  # named once, and training went on

    service = tmp_path / "edgerl.toml"  # the service resumes the same run the same way
    service.write_text(
        f'[env]\nid = "CartPole-v1"\n[train]\nrun_dir = "{run}"\nsteps = 2000\n'
        f'[eval]\nevery_steps = 500\nepisodes = 2\n[hw]\nstate_dir = "{tmp_path / "hw"}"\n'
    )
    r = cli("daemon", "--config", service)
    assert r.code == 0 and "crashed" not in r.err, r.err[-2000:]
    r = cli("plot", "--run-dir", run, "--terminal")
    assert r.code == 0, r.err
    assert f"{run / 'metrics.csv'} has " in r.err  # the damage, named once per file
    assert "| eval " in r.out and " steps/s" in r.out


PLOT_FILES = {
    "metrics.csv": b"step,wall_s,sps,episodes,return_mean,epsilon,loss,updates\n"
    b"100,1.0,100,1,10,0.9,,0\n200,2.0,100,2,12,0.8,0.5,10\n",
    "episodes.csv": b"step,episode,env,return,length,wall_s\n"
    b"50,1,0,10,50,0.5\n150,2,0,14,100,1.5\n",
    "eval.csv": b"step,wall_s,episodes,return_mean,return_std,return_min,return_max,length_mean,"
    b"cut,eval_s\n200,2.0,2,20,0,20,20,20,0,0.1\n",
    "load.csv": b"time,step,cpu_mean,cpu_max_core,gr3d,gr3d_mhz,emc,ram_used_mb,temp_max_c,"
    b"power_mw\n2026-01-01T00:00:00,100,50,90,,,,1000,40,\n",
}


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(damaged=damaged_csv(PLOT_FILES["episodes.csv"]))
def test_plot_of_damaged_files_draws_what_it_can_or_says_why(tmp_path_factory, damaged):
    run = tmp_path_factory.mktemp("run")
    for name, good in PLOT_FILES.items():
        (run / name).write_bytes(good)
    (run / "episodes.csv").write_bytes(damaged)
    (run / "metrics.csv").write_bytes(PLOT_FILES["metrics.csv"] + damaged[-300:])
    code, _, err = run_cli("plot", "--run-dir", run, "--terminal")
    assert code == 0 or one_sentence(code, err) is None, err
    assert "internal error" not in err


def test_a_plot_of_damaged_files_is_drawn_and_names_the_damage(tmp_path):
    run = write_run(tmp_path)
    for name in PLOT_FILES:
        with (run / name).open("ab") as f:
            f.write(RANDOM_4K + HUGE_CELL + b"inf,inf,inf,inf,inf,inf,inf,inf\n")
    code, _, err = run_cli("plot", "--run-dir", run, "-o", run / "curve.svg")
    assert code == 0 and (run / "curve.svg").exists(), err
    assert all(f"{run / name} has " in err for name in PLOT_FILES), err


GOOD_STATUS = {
    "state": "training",
    "message": "",
    "env": "ALE/Pong-v5",
    "run_dir": "/var/lib/edgerl/runs/Pong-v5",
    "pid": 1,
    "step": 5000,
    "total_steps": 10000,
    "sps": 100.0,
    "episodes": 3,
    "return_mean": -20.5,
    "eval_return": None,
    "eval_step": None,
    "epsilon": 0.5,
    "updates": 100,
    "started_at": "2026-01-01T00:00:00+00:00",
    "updated_at": "2026-01-01T00:01:00+00:00",
    "updated_unix": 1767225660.0,
    "checkpoint": None,
    "learning_starts": 100,
    "fill_from": 0,
    "checkpoint_error": None,
    "load": None,
    "load_line": None,
    "clocks": "unchanged",
    "write_problems": [],
    "fleet": None,
}
ACTOR = {
    "id": 1,
    "state": "restarting",
    "node": "10.0.0.3",
    "node_id": "d752dc48",
    "host": "board3",
    "pid": 4242,
    "transitions": 120_000,
    "sps": 850.0,
    "restarts": 1,
    "lost": "its node died",
}


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        *[(d, "is damaged") for d in WRONG_DOCUMENTS],
        ({**GOOD_STATUS, "pid": "1234"}, "pid is '1234', not a whole number"),
        ({**GOOD_STATUS, "pid": 10**30}, "out of range"),
        ({**GOOD_STATUS, "updated_unix": "yesterday"}, "updated_unix is 'yesterday'"),
        ({**GOOD_STATUS, "step": float("nan")}, "step is nan"),
        ({**GOOD_STATUS, "write_problems": [1]}, "write_problems is not a list of text"),
    ],
)
def test_status_of_a_damaged_status_json_is_one_sentence(tmp_path, doc, says):
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    (tmp_path / "status.json").write_bytes(data)
    for json_flag in ([], ["--json"]):
        code, _, err = run_cli("status", "--run-dir", tmp_path, *json_flag)
        one_sentence(code, err)
        assert says in err and str(tmp_path / "status.json") in err


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=damaged_json(GOOD_STATUS))
def test_status_of_any_status_json_never_fails_inside(tmp_path_factory, data):
    run = tmp_path_factory.mktemp("run")
    (run / "status.json").write_bytes(data)
    for json_flag in ([], ["--json"]):
        code, out, err = run_cli("status", "--run-dir", run, *json_flag)
        if code == 2:
            one_sentence(code, err)
        else:  # a document that is still a good one: the usual answer
            assert code in (0, 3) and out and not err, err


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(actor=damaged_json(ACTOR), fleet_key=st.sampled_from(["address", "running", "actors"]))
def test_status_of_any_fleet_in_status_json_never_fails_inside(tmp_path_factory, actor, fleet_key):
    """The remote actors' part: an actor entry or a fleet field damaged, the rest shown."""
    run = tmp_path_factory.mktemp("run")
    try:
        entry = json.loads(actor)
    except ValueError:
        entry = actor.decode("latin-1")
    fleet = {"address": "10.0.0.1:6379", "running": 1, "transitions": 9, "weights_lag_max": 50}
    fleet["actors"] = [{**ACTOR, "id": 0, "state": "running"}, entry]
    fleet[fleet_key] = entry if fleet_key != "actors" else fleet["actors"]
    (run / "status.json").write_text(json.dumps({**GOOD_STATUS, "fleet": fleet}))
    code, out, err = run_cli("status", "--run-dir", run)
    assert code in (0, 3) and not err, err
    assert "fleet (" in out and "actor 0 on 10.0.0.3 (board3), pid 4242: running" in out


def test_status_shows_an_actors_id_and_state_only_as_the_trainer_writes_them(tmp_path):
    """An id that is no number and a state the trainer has not: '?' and 'an unknown state', not
    whatever text the file holds (issue 58)."""
    fleet = {"address": "10.0.0.1:6379", "running": 1, "transitions": 9, "weights_lag_max": 50}
    fleet["actors"] = [
        {**ACTOR, "id": 0, "state": "running"},
        {"id": "0 on 10.6.6.6: running, 9,999,999 transitions", "state": "owned"},
        {"id": 2, "state": "starting"},
    ]
    (tmp_path / "status.json").write_text(json.dumps({**GOOD_STATUS, "fleet": fleet}))
    code, out, err = run_cli("status", "--run-dir", tmp_path)
    assert code in (0, 3) and not err, err
    assert "actor ?: in an unknown state" in out and "10.6.6.6" not in out and "owned" not in out
    assert "actor 2: starting (waiting for a node with room)" in out


def test_a_finished_run_says_so_and_is_no_error(cli, tmp_path):
    run = tmp_path / "cp"
    assert cli("train", "--env", "CartPole-v1", "--steps", "300", "--run-dir", run).code == 0
    r = cli("status", "--run-dir", run)
    assert r.code == 0, r.out
    assert "finished at " in r.out and "step 300 of 300" in r.out and "stopped" not in r.out
    r = cli("status", "--run-dir", run, "--json")
    assert r.code == 0 and json.loads(r.out)["finished"] is True
    assert json.loads(r.out)["state"] == "finished"


def test_an_older_stopped_status_at_its_last_step_reads_as_finished(tmp_path):
    (tmp_path / "status.json").write_text(
        json.dumps({**GOOD_STATUS, "state": "stopped", "step": 10000})
    )
    code, out, _ = run_cli("status", "--run-dir", tmp_path)
    assert code == 0 and "finished at" in out
    (tmp_path / "status.json").write_text(json.dumps({**GOOD_STATUS, "state": "stopped"}))
    code, out, _ = run_cli("status", "--run-dir", tmp_path)
    assert code == 3 and "stopped at" in out


def write_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    for name, good in PLOT_FILES.items():
        (run / name).write_bytes(good)
    return run


# -- the frame stream's pointer and header ---------------------------------------------------


GOOD_POINTER = {
    "path": "/dev/shm/edgerl-0123456789abcdef.frames",
    "session": 12345,
    "pid": 1,
    "height": 84,
    "width": 84,
    "slots": 4,
    "action_meanings": ["NOOP", "FIRE"],
    "created": 1767225660.0,
}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=damaged_json(GOOD_POINTER))
# Found by a CI run: a NUL byte (or a newline) in the path must still give one sentence.
@example(data=json.dumps({**GOOD_POINTER, "path": "\u0000"}).encode())
@example(data=json.dumps({**GOOD_POINTER, "path": "/dev/shm/a\nb\u0000"}).encode())
def test_any_display_json_is_read_or_named_as_damaged(tmp_path_factory, data):
    from edgerl.stream.reader import FrameReader, StreamError, read_pointer

    run = tmp_path_factory.mktemp("run")
    (run / "display.json").write_bytes(data)
    try:
        read_pointer(run)
        FrameReader(run).close()
    except StreamError as e:
        # One line, naming a file, a damaged path shown escaped.
        assert str(e).isprintable() and "/" in str(e), str(e)
    except FileNotFoundError:
        pass  # it names a stream that is not there: the viewer waits for one


@pytest.mark.parametrize(
    "pointer",
    [
        *WRONG_DOCUMENTS,
        json.dumps({**GOOD_POINTER, "pid": "1"}).encode(),
        json.dumps({**GOOD_POINTER, "pid": 10**30}).encode(),
        json.dumps({**GOOD_POINTER, "height": None}).encode(),
    ],
)
def test_the_console_viewer_on_a_damaged_display_json_says_so_and_ends(tmp_path, pointer):
    (tmp_path / "display.json").write_bytes(pointer)
    code, _, err = run_cli("view", "--run-dir", tmp_path, "--console", "--timeout", "0.2")
    one_sentence(code, err)
    assert "display.json is damaged" in err, err


@pytest.mark.parametrize("pointer", [b"[]", RANDOM_4K])
def test_a_snapshot_of_a_damaged_display_json_ends_at_once(tmp_path, pointer):
    (tmp_path / "display.json").write_bytes(pointer)
    code, _, err = run_cli(
        "view", "--run-dir", tmp_path, "--snapshot", tmp_path / "x.png", "--timeout", "600"
    )
    one_sentence(code, err)  # within a second, not after 600 s
    assert "display.json is damaged" in err and not (tmp_path / "x.png").exists()


def test_a_display_json_naming_no_file_is_damage(tmp_path):
    proc = lookalike_trainer()  # a live trainer, so only the stream can be wrong
    try:
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)  # opening it to read would wait for a writer forever
        for path in ("/dev/null", str(fifo), str(tmp_path)):
            pointer = {**GOOD_POINTER, "pid": proc.pid, "path": path}
            (tmp_path / "display.json").write_text(json.dumps(pointer))
            code, _, err = run_cli("view", "--run-dir", tmp_path, "--console", "--timeout", "0.2")
            one_sentence(code, err)
            assert path in err, err
    finally:
        proc.kill()
        proc.wait(timeout=60)


def test_a_snapshot_of_a_stream_with_a_random_header_says_it_is_damaged(
    ring_with_live_pid,  # noqa: F811 - the fixture
    tmp_path,
):
    with open(ring_with_live_pid.path, "r+b") as f:
        f.write(RANDOM_4K[:48])
    r = run_edgerl(  # the default --timeout is 30 s; 600 s would show a hang as a failure
        "view", "--run-dir", tmp_path, "--snapshot", tmp_path / "x.png", "--timeout", "600",
        timeout=300,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "it is not a frame stream" in r.stderr or "corrupt header" in r.stderr, r.stderr
    assert "internal error" not in r.stderr and not (tmp_path / "x.png").exists()


# -- a policy's description and a run's saved config ------------------------------------------


GOOD_SIDECAR = {
    "env_id": "CartPole-v1",
    "kind": "vector",
    "obs_shape": [4],
    "obs_dtype": "float32",
    "action_meanings": ["0", "1"],
    "env_config": {"id": "CartPole-v1"},
    "source_checkpoint": "ckpt-000001-step0000000300.ckpt",
    "source_sha256": "0" * 64,
    "step": 300,
    "format": "edgerl-policy",
}


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=damaged_json(GOOD_SIDECAR))
def test_any_policy_description_is_read_or_refused_in_a_sentence(tmp_path_factory, data):
    from edgerl.policies.sidecar import SIDECAR_FORMAT, Sidecar
    from edgerl.policies.sidecar import ExportError as Refused

    assert GOOD_SIDECAR["format"] == SIDECAR_FORMAT
    policy = tmp_path_factory.mktemp("policy") / "policy.engine"
    (policy.parent / "policy.engine.json").write_bytes(data)
    try:
        sidecar = Sidecar.read(policy)
    except Refused as e:
        assert "\n" not in str(e)
    else:
        sidecar.env_spec()  # what play and export build from it


@pytest.mark.parametrize("saved", [b"env = 3\n", b"[env]\nid = 5\n", RANDOM_4K, b"env = []\n"])
def test_a_damaged_config_toml_of_a_run_is_no_game(tmp_path, saved):
    from edgerl.report.rundir import run_game

    (tmp_path / "config.toml").write_bytes(saved)
    assert run_game(tmp_path) is None
    code, _, err = run_cli("config", "--set", f"train.run_dir={tmp_path}")
    assert code == 0 and "internal error" not in err, err


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    data=st.binary(max_size=300)
    | st.sampled_from([b"[env", RANDOM_4K, b"[env]\nid = " + b"[" * 50_000 + b"]" * 50_000])
    | st.text(alphabet="[]{}=.\"'\n abcenvid0123", max_size=200).map(str.encode)
)
def test_any_config_file_is_read_or_refused_in_a_sentence(tmp_path_factory, data):
    config = tmp_path_factory.mktemp("config") / "edgerl.toml"
    config.write_bytes(data)
    code, _, err = run_cli("config", "--config", config)
    assert code == 0 or one_sentence(code, err) is None, err


@pytest.mark.parametrize("value", ["[" * 5000, "{" * 5000, "[" * 5000 + "]" * 5000])
def test_a_set_value_nested_beyond_reason_is_one_sentence(value):
    code, _, err = run_cli("config", "--set", f"env.id={value}")
    one_sentence(code, err)


def extreme_rows(run: Path) -> None:
    """The largest finite numbers (not inf: those are skipped) in every curve's file."""
    with (run / "episodes.csv").open("ab") as f:
        f.write(b"-1e308,91,0,1,1,1\n1e308,92,0,1e308,1,1e308\n95,93,0,-1e308,1,1\n")
    with (run / "metrics.csv").open("ab") as f:
        f.write(b"1e308,-1e308,1e308,1,1e308,0.5,1e308,1\n300,3.0,-1e308,3,1e308,0.5,,1\n")
    with (run / "eval.csv").open("ab") as f:
        f.write(b"300,3.0,2,1e308,0,-1e308,1e308,20,0,0.1\n")


@pytest.mark.parametrize("out", ["--terminal", "curve.png"])
def test_a_plot_of_the_largest_finite_numbers_leaves_them_out(tmp_path, out):
    run = write_run(tmp_path)
    extreme_rows(run)
    args = ["--terminal"] if out == "--terminal" else ["-o", run / out]
    code, stdout, err = run_cli("plot", "--run-dir", run, *args)
    assert code == 0 and "internal error" not in err and "Warning" not in err, err
    assert "e+307" not in stdout and "e+308" not in stdout


# Something else than a file where a run file should be: a FIFO blocks a reader in open(), and a
# link to /dev/zero feeds it for ever. Each reader must name it (or skip a side file) and go on.
NOT_FILES = ["status.json", "metrics.csv", "episodes.csv", "eval.csv", "config.toml"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("trained") / "cp"
    r = run_edgerl("train", *CARTPOLE, "--run-dir", run, "--steps", "1000", "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (run / "checkpoints" / "best.ckpt").is_file()
    return run


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_no_reader_waits_on_something_else_than_a_file(trained_run, tmp_path, kind):
    import shutil

    run = tmp_path / "cp"
    shutil.copytree(trained_run, run)
    for name in [*NOT_FILES, "checkpoints/best.ckpt"]:
        (run / name).unlink()
        if kind == "fifo":
            os.mkfifo(run / name)
        else:
            (run / name).symlink_to(kind)

    def run_it(*args: object) -> tuple[int, str]:
        r = run_edgerl(*[str(a) for a in args], timeout=240)  # a hang fails here
        assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
        return r.returncode, r.stderr

    code, err = run_it("status", "--run-dir", run)
    assert code == 2 and f"cannot read {run / 'status.json'}: it is " in err, err
    code, err = run_it("plot", "--run-dir", run, "--terminal")
    assert code == 2 and "cannot read" in err and "not a file" in err, err
    code, err = run_it("play", "--run-dir", run, "--episodes", "1")
    assert code in (0, 2) and "best.ckpt" in err, err
    code, err = run_it("train", *CARTPOLE, "--run-dir", run, "--steps", "1200", "--quiet")
    if kind == "fifo":  # the resume: side files are named and skipped, training goes on
        assert code == 0, err[-3000:]
        assert "eval.csv" in err and "metrics.csv" in err
    else:  # a link in a run is refused, named, and nothing is read or written through it
        assert code == 2 and "holds 5 symbolic links (config.toml, episodes.csv" in err, err


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(eval_csv=damaged_csv(PLOT_FILES["eval.csv"]), metrics=damaged_csv(PLOT_FILES["metrics.csv"]))
def test_what_a_resume_reads_of_any_eval_or_metrics_csv_never_stops_it(
    tmp_path_factory, eval_csv, metrics
):
    from edgerl.config import EvalConfig
    from edgerl.files.sidefiles import SideFiles
    from edgerl.report.evaluate import Evaluator
    from edgerl.report.metrics import CSV_COLUMNS, MetricsWriter

    run = tmp_path_factory.mktemp("run")
    (run / "eval.csv").write_bytes(eval_csv)
    (run / "metrics.csv").write_bytes(metrics)
    evaluator = Evaluator(run, 500, EvalConfig())  # counts the evaluations of earlier sessions
    assert evaluator.count >= 0
    MetricsWriter(run, CSV_COLUMNS, False, side=SideFiles()).close()  # sets damaged ones aside


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    fields=st.fixed_dictionaries(
        {},
        optional={
            name: st.integers(0, 2**32 - 1)
            for name in ("version", "slots", "h", "w", "actions", "reserved")
        }
        | {name: st.integers(0, 2**64 - 1) for name in ("session", "writes")},
    ),
    slot_bytes=st.binary(min_size=0, max_size=256),
)
def test_any_frame_stream_header_or_slot_is_read_or_named_as_damaged(
    ring_with_live_pid,  # noqa: F811 - the fixture
    tmp_path,
    fields,
    slot_bytes,
):
    from edgerl.stream import HEADER, MAGIC, VERSION
    from edgerl.stream.reader import FrameReader, StreamError

    from .helpers import frame_for, meta_for

    ring = ring_with_live_pid
    good = dict(magic=MAGIC, version=VERSION, slots=ring.slots, h=ring.height, w=ring.width)
    good.update(actions=ring.num_actions, reserved=0, session=ring.session, writes=0)
    _set_header(ring.path, **good)  # a good header again (the ring writes it once), then damage
    ring.publish(frame_for(2), meta_for(2))
    _set_header(ring.path, **fields)
    with open(ring.path, "r+b") as f:
        f.seek(HEADER.size)
        f.write(slot_bytes)  # the first slot's sequence number, metadata and frame
    try:
        reader = FrameReader(tmp_path)
        reader.latest()
        reader.close()
    except StreamError as e:
        assert "\n" not in str(e)


@pytest.mark.parametrize(
    ("table", "damage", "says"),
    [
        ("records.csv", lambda t: t.replace(",1500032,", ",many,", 1), "(steps is 'many')"),
        ("records.csv", lambda t: t.replace(",199,", ",nan,", 1), "(wall_s is 'nan')"),
        ("records.csv", lambda t: t.rstrip("\n") + "\nALE/Pong-v5,pqn\n", "(2 cells, not 8)"),
        ("atari_scores.csv", lambda t: t.replace("game,", "gme,", 1), "no column 'game'"),
        ("atari_scores.csv", lambda t: t.replace("pong,-20.7,", "pong,-20.7x,", 1), "(random is"),
        ("atari_scores.csv", lambda t: t.replace("pong,-20.7,14.6", "pong,9.3,9.3", 1), "pong's"),
        ("atari_scores.csv", lambda t: t + '"broken\n', "is damaged at line"),
    ],
)
def test_a_damaged_table_of_edgerls_own_is_one_sentence_at_an_atari_runs_start(
    cli, tmp_path, monkeypatch, table, damage, says
):
    """The tables edgerl ships (edgerl/data/) are read like any file: damaged by an edit or a
    broken install, an Atari run's start names the file and the line (issue 58, item 5)."""
    from edgerl.envs import scores
    from edgerl.files import packaged
    from edgerl.report import estimate

    data = tmp_path / "data"
    data.mkdir()
    for name in ("records.csv", "atari_scores.csv"):
        text = packaged.DATA.joinpath(name).read_text()
        (data / name).write_text(damage(text) if name == table else text)
    assert (data / table).read_text() != packaged.DATA.joinpath(table).read_text()
    monkeypatch.setattr(packaged, "DATA", data)
    scores._table.cache_clear()  # read again from the damaged copies, and after the test
    estimate.records.cache_clear()  # from edgerl's own
    try:
        r = cli("train", "--env", "ALE/Pong-v5", "--steps", "64", "--run-dir", tmp_path / "r")
    finally:
        scores._table.cache_clear()
        estimate.records.cache_clear()
    assert r.code == 1 and "Traceback" not in r.err and "internal error" not in r.err, r.err
    (line,) = [ln for ln in r.err.splitlines() if ln.startswith("edgerl: error:")]
    assert f"edgerl's table edgerl/data/{table}" in line and says in line
    assert line.endswith("reinstall edgerl")
