"""Export: ONNX checked in a real ONNX Runtime session; TensorRT where TensorRT and a GPU exist."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from edgerl.errors import EdgerlError
from edgerl.export.common import check_agreement, collect_observations, compare
from edgerl.export.run import ExportRequest, run_export
from edgerl.export.tensorrt import (
    ScalesCache,
    calibration_cache_path,
    engine_name,
    profile_shapes,
)
from edgerl.hw.device import fast_fp16
from edgerl.policies.onnx import OnnxPolicy, session_providers
from edgerl.policies.sidecar import ExportError, Sidecar, check_batch
from edgerl.policies.tensorrt import flavor

from .conftest import PONG_FAST

HAS_TRT = importlib.util.find_spec("tensorrt") is not None and torch.cuda.is_available()
needs_trt = pytest.mark.skipif(not HAS_TRT, reason="needs TensorRT and a CUDA GPU")


@pytest.fixture(scope="module")
def pong_run(tmp_path_factory):
    from edgerl.cli import main

    run = tmp_path_factory.mktemp("export") / "pong"
    assert main(["train", *PONG_FAST, "--steps", "400", "--run-dir", str(run), "--quiet"]) == 0
    return run


def test_onnx_export_is_checked_against_pytorch(cli, pong_run):
    r = cli("export", "--run-dir", pong_run, "--onnx", "--json")
    assert r.code == 0, r.err
    rows = json.loads(r.out)
    onnx_row = rows[0]
    assert onnx_row["backend"].startswith("onnxruntime") and onnx_row["agreement"]["ok"]
    assert onnx_row["agreement"]["max_abs_diff"] < 1e-4
    assert onnx_row["agreement"]["actions_equal"] == onnx_row["agreement"]["total"] == 96
    assert rows[-1]["backend"].startswith("torch")
    path = Path(onnx_row["file"])
    assert path.parent == pong_run / "export" and path.name == "policy-Pong-v5-step400.onnx"

    import onnx

    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    assert model.opset_import[0].version == 17
    graph_input = model.graph.input[0]
    assert graph_input.name == "obs"
    assert graph_input.type.tensor_type.elem_type == onnx.TensorProto.UINT8
    dims = graph_input.type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and [d.dim_value for d in dims[1:]] == [4, 84, 84]
    assert [o.name for o in model.graph.output] == ["q_values", "action"]


def test_ctrl_c_after_the_onnx_file_was_checked_names_it(cli, pong_run, tmp_path, monkeypatch):
    """Ctrl-C while the checkpoint's own latency is timed: the ONNX file has its name, checked,
    and the sentence says so (it said only "interrupted")."""
    import edgerl.export.run as export_run

    def interrupt(*_args, **_kwargs):
        raise KeyboardInterrupt

    calls = iter([export_run.latency_us, interrupt])  # ONNX Runtime's timing, then PyTorch's
    monkeypatch.setattr(export_run, "latency_us", lambda *a: next(calls)(*a))
    out = tmp_path / "out"
    r = cli("export", "--run-dir", pong_run, "--onnx", "-o", out)
    onnx = out / "policy-Pong-v5-step400.onnx"
    assert r.code == 130 and "Traceback" not in r.err
    assert f"interrupted: {onnx} was written and checked before it" in r.err
    assert onnx.is_file() and (out / f"{onnx.name}.json").is_file()


def test_an_interrupted_export_names_what_is_there_checked_or_not(tmp_path):
    """A TensorRT engine is built under its name before it is checked: a Ctrl-C then says so."""
    from edgerl.cli.policies import export_interrupted

    onnx, engine = tmp_path / "p.onnx", tmp_path / "p.engine"
    assert export_interrupted([], []).startswith("interrupted: nothing was written")
    both = export_interrupted([onnx], [engine])
    assert f"{onnx} was written and checked" in both
    assert f"{engine} was written but not checked" in both
    assert "no file was checked" in export_interrupted([], [engine])


def test_sidecar_contents(pong_run):
    from edgerl.files.checkpoint import file_sha256
    from edgerl.policies import newest_checkpoint

    ckpt = newest_checkpoint(pong_run)
    rows = run_export(ExportRequest(checkpoint=ckpt, out=pong_run / "x" / "p.onnx"))
    sidecar = json.loads((pong_run / "x" / "p.onnx.json").read_text())
    assert sidecar["format"] == "edgerl-policy" and sidecar["env_id"] == "ALE/Pong-v5"
    assert sidecar["source_checkpoint"] == str(ckpt.resolve())
    assert sidecar["source_sha256"] == file_sha256(ckpt)
    assert sidecar["action_meanings"][:2] == ["NOOP", "FIRE"]
    assert sidecar["obs_shape"] == [4, 84, 84] and sidecar["precision"] == "fp32"
    assert sidecar["onnx_opset"] == 17 and sidecar["step"] == 400
    assert sidecar["agreement"]["ok"] and sidecar["latency_us"]["p50"] > 0
    assert rows[0].file == pong_run / "x" / "p.onnx"


def test_onnx_and_torch_play_the_same_game(cli, pong_run):
    onnx_file = next((pong_run / "export").glob("*.onnx"))
    results = {}
    for args in (["--run-dir", pong_run], ["--model", onnx_file]):
        r = cli("play", *args, "--episodes", "1", "--seed", "11", "--json")
        assert r.code == 0, r.err
        results[json.loads(r.out)["backend"]] = json.loads(r.out)
    assert results["onnx"]["returns"] == results["torch"]["returns"]
    assert results["onnx"]["steps"] == results["torch"]["steps"]


def test_an_onnx_file_alone_knows_its_game(cli, pong_run, tmp_path):
    onnx_file = next((pong_run / "export").glob("*.onnx"))
    lone = tmp_path / "lone.onnx"
    lone.write_bytes(onnx_file.read_bytes())  # no sidecar next to it: metadata inside
    r = cli("play", "--model", lone, "--episodes", "1", "--json")
    assert r.code == 0 and json.loads(r.out)["env"] == "ALE/Pong-v5"


def test_export_fails_when_onnx_runtime_disagrees(pong_run, monkeypatch):
    from edgerl.policies import newest_checkpoint
    from edgerl.policies.onnx import OnnxPolicy

    real = OnnxPolicy.q_values
    monkeypatch.setattr(OnnxPolicy, "q_values", lambda self, obs: real(self, obs) + 0.05)
    with pytest.raises(ExportError, match=r"disagrees with PyTorch .* max \|dQ\| 5\.00e-02"):
        run_export(ExportRequest(checkpoint=newest_checkpoint(pong_run), out=pong_run / "bad"))


@pytest.mark.skipif(HAS_TRT, reason="TensorRT is installed here")
def test_the_export_table_names_what_a_network_outputs(cli, tmp_path):
    """PPO's network gives logits, not Q-values: its agreement says so (a DQN's says dQ)."""
    run = tmp_path / "ppo"
    args = ["--env", "CartPole-v1", "--set", "agent.algo=ppo", "--steps", "1024", "--quiet"]
    assert cli("train", *args, "--run-dir", run).code == 0
    r = cli("export", "--run-dir", run, "--onnx")
    assert r.code == 0, r.err[-2000:]
    assert "max |d logits|" in r.out and "dQ" not in r.out


def test_trt_without_tensorrt_says_what_is_missing(cli, pong_run, tmp_path):
    import torch

    r = cli("export", "--run-dir", pong_run, "--trt", "-o", tmp_path / "out")
    assert r.code == 2
    if torch.cuda.is_available():
        assert "--trt needs TensorRT, which is not installed" in r.err
    else:  # no GPU: installing TensorRT would not help, and it is not suggested
        assert "TensorRT engines are built and run on a CUDA GPU, and none is usable" in r.err
        assert "pip install" not in r.err
    assert "engines must be built on the device that runs them" in r.err
    assert "--onnx works anywhere" in r.err
    assert not (tmp_path / "out").exists()  # it said so before doing any work
    assert "exporting" not in r.err  # nor named a policy it would not export


def test_play_an_engine_without_tensorrt(cli, tmp_path):
    if HAS_TRT:
        pytest.skip("TensorRT is installed here")
    (tmp_path / "p.engine").write_bytes(b"x")
    r = cli("play", "--model", tmp_path / "p.engine")
    assert r.code == 2 and ("needs TensorRT" in r.err or "on a CUDA GPU, and none" in r.err)


def test_export_usage_errors(cli, tmp_path, monkeypatch):
    assert "give --onnx, --trt or both" in cli("export").err
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    r = cli("export", "--onnx")
    assert r.code == 2 and "no run with checkpoints in" in r.err
    assert "give --run-dir RUN, --checkpoint FILE or --model FILE" in r.err
    r = cli("export", "--onnx", "--int8")
    assert r.code == 2 and "--int8 is a TensorRT engine precision: add --trt" in r.err
    # --int8 alone: that it needs --trt, in one sentence, not click's usage block
    r = cli("export", "--int8")
    assert r.code == 2 and r.err.startswith("edgerl: error: --int8 is a TensorRT engine")
    assert len(r.err.strip().splitlines()) == 1 and "(see 'edgerl export --help')" in r.err
    assert "Usage:" not in r.err
    r = cli("export", "--onnx", "--checkpoint", tmp_path / "none.ckpt")
    assert r.code == 2 and "does not exist" in r.err


@pytest.mark.parametrize(
    ("version", "batch_flag", "precision_flags", "strong"),
    [
        ("8.5.2.2", True, True, False),  # JetPack 5.1
        ("8.6.2.3", True, True, False),  # JetPack 6.0
        ("10.3.0.30", False, True, False),  # JetPack 6.1/6.2
        ("10.13.3.9", False, True, False),  # JetPack 7 (Thor)
        ("11.4.0.106", False, False, True),
    ],
)
def test_tensorrt_api_flavors(version, batch_flag, precision_flags, strong):
    fl = flavor(version)
    assert (fl.explicit_batch_flag, fl.precision_flags, fl.strongly_typed) == (
        batch_flag,
        precision_flags,
        strong,
    )
    assert fl.int8_calibration == (not strong)


def test_old_or_unreadable_tensorrt_versions():
    with pytest.raises(ExportError, match=r"older than 8\.5"):
        flavor("8.2.1")
    with pytest.raises(ExportError, match="cannot read"):
        flavor("nightly")


@pytest.mark.parametrize(
    ("capability", "fast"),
    [
        ((5, 3), True),
        ((6, 2), True),
        ((7, 2), True),
        ((8, 7), True),
        ((9, 0), True),
        ((6, 1), False),
        ((5, 2), False),
    ],
)
def test_fast_fp16_by_compute_capability(capability, fast):
    assert fast_fp16(capability) is fast


def test_engine_names_say_what_they_are_for():
    name = engine_name("Pong-v5", "fp16", 8, flavor("10.3.0.30"), "NVIDIA Jetson AGX Orin")
    assert name == "policy-Pong-v5-fp16-b8-trt10.3.0-jetson-agx-orin.engine"


def test_compare_tolerates_near_ties_only():
    ref = np.array([[1.0, 0.99999, 0.0], [0.0, 2.0, 1.0]])
    ok = compare(ref, ref + 1e-6, np.array([1, 1]))
    assert ok.ok and ok.near_ties == 1 and ok.actions_equal == 1
    wrong = compare(ref, ref, np.array([0, 2]))
    assert not wrong.ok


class EngineSizedOnnxPolicy(OnnxPolicy):
    """An ONNX Runtime session standing where a TensorRT engine built for ``--batch 8`` would:
    it refuses larger batches exactly as the engine's policy does."""

    batch_max = 8

    def _run(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        check_batch(len(obs), self.batch_max)
        return super()._run(obs)


def test_the_agreement_check_feeds_an_engine_at_most_its_batch(cli, pong_run):
    r = cli("export", "--run-dir", pong_run, "--onnx", "--json")
    assert r.code == 0, r.err
    policy = EngineSizedOnnxPolicy(Path(json.loads(r.out)[0]["file"]), cpu_only=True)
    obs = collect_observations(policy.env_config, 96)
    with pytest.raises(EdgerlError, match="batches of at most 8, not 96"):
        policy.q_values(obs)  # all 96 at once, as the check used to: every --trt export failed

    from edgerl.policies import newest_checkpoint
    from edgerl.policies.torch import TorchPolicy

    reference = TorchPolicy.from_file(newest_checkpoint(pong_run)).q_values(obs)
    agreement = check_agreement(policy, obs, reference.astype(np.float64))
    assert agreement.ok and agreement.total == 96 and agreement.actions_equal == 96
    wrong = check_agreement(policy, obs, reference[:, ::-1].astype(np.float64))
    assert not wrong.ok  # the chunks are put back in order and compared, not just run


def test_int8_calibrates_at_the_calibration_batch_not_at_batch_one():
    run, calibration = profile_shapes((4, 84, 84), 8)
    assert run == ((1, 4, 84, 84), (1, 4, 84, 84), (8, 4, 84, 84))
    assert calibration == ((8, 4, 84, 84),) * 3  # TensorRT calibrates at the profile's opt


def test_int8_scales_are_cached_per_checkpoint_and_a_damaged_cache_is_not_used(tmp_path, caplog):
    old = ScalesCache(calibration_cache_path(tmp_path, "Pong-v5", "ab" * 32))
    new = ScalesCache(calibration_cache_path(tmp_path, "Pong-v5", "cd" * 32))
    assert old.read() is None  # nothing cached yet: TensorRT calibrates
    table = b"TRT-100300-EntropyCalibration2\nobs: 3c010a14\n"
    old.write(table)
    assert old.read() == table  # the next build of this checkpoint skips calibration
    assert new.read() is None  # a newer checkpoint never takes an older one's scales
    damaged = old.path.read_bytes().replace(b"3c01", b"3c02")
    old.path.write_bytes(damaged)
    with caplog.at_level("WARNING"):
        assert old.read() is None  # recalibrated, not quantized with edited scales
    assert f"{old.path} is damaged" in caplog.text
    assert old.path.read_bytes() == damaged  # kept until new scales replace it
    old.path.write_bytes(table)  # a table without edgerl's checksum line is not trusted either
    assert old.read() is None


def test_onnx_runtimes_tensorrt_provider_keeps_its_engine_next_to_the_model(tmp_path):
    model = tmp_path / "policy.onnx"
    available = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    chosen = session_providers(model, available, "1.19.2")
    name, options = chosen[0]
    assert name == "TensorrtExecutionProvider" and chosen[1:] == available[1:]
    assert options["trt_engine_cache_enable"] and options["trt_timing_cache_enable"]
    assert options["trt_engine_cache_path"] == str(tmp_path / "policy.trt-cache")
    assert options["trt_timing_cache_path"] == options["trt_engine_cache_path"]
    # 1.16 (JetPack 5's) rejects options it does not know: no timing cache path there.
    assert "trt_timing_cache_path" not in session_providers(model, available, "1.16.0")[0][1]
    assert session_providers(model, available[2:], "1.19.2") == ["CPUExecutionProvider"]
    assert session_providers(model, available, "1.19.2", cuda=False) == ["CPUExecutionProvider"]


def test_a_missing_sidecar_is_explained(tmp_path):
    with pytest.raises(ExportError, match=r"p.engine.json is missing"):
        Sidecar.read(tmp_path / "p.engine")


@needs_trt
def test_tensorrt_engine_round_trip(cli, pong_run, tmp_path):
    r = cli("export", "--run-dir", pong_run, "--trt", "-o", tmp_path, "--json")
    assert r.code == 0, r.err
    rows = json.loads(r.out)
    engine = next(row for row in rows if row["backend"].startswith("tensorrt"))
    assert engine["agreement"]["ok"]
    path = Path(engine["file"])
    assert path.suffix == ".engine" and Path(str(path) + ".json").exists()
    assert list(tmp_path.glob("timing-trt*.cache"))
    results = [
        json.loads(cli("play", *args, "--episodes", "1", "--seed", "5", "--json").out)
        for args in (["--model", path], ["--run-dir", pong_run])
    ]
    assert results[0]["returns"] == results[1]["returns"]


def test_export_finds_the_newest_run_and_says_how_to_play_it(cli, pong_run, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))  # no service run here
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    shutil.copytree(pong_run, tmp_path / "runs" / "Pong-v5")  # cwd is tmp_path
    r = cli("export", "--onnx")
    assert r.code == 0, r.err
    onnx = tmp_path / "runs" / "Pong-v5" / "export"
    wrote = [line for line in r.out.splitlines() if line.startswith("wrote ")]
    assert len(wrote) == 2 and wrote[0].startswith(f"wrote {onnx}/") and wrote[0].endswith(".onnx")
    path = wrote[0].removeprefix("wrote ")
    assert wrote[1] == f"wrote {path}.json"  # its sidecar: every file it wrote, named
    assert Path(path + ".json").is_file()
    # no desktop here: the view that draws without one (--render screen would end in a sentence)
    assert f"play it with: edgerl play --model {path} --render console --fps 15" in r.out
    monkeypatch.setenv("DISPLAY", ":0")
    assert f"--model {path} --render screen" in cli("export", "--onnx").out
    r = cli("play", "--model", path, "--episodes", "1", "--json")
    assert r.code == 0, r.err
    # every latency figure comes with the threads and the load it was measured under
    played = json.loads(r.out)
    assert played["threads"] >= 1 and "CPUs" in played["load"]
    assert "CPU thread" in cli("export", "--onnx").out  # the table's title says them


def test_latency_is_measured_with_the_threads_the_load_leaves_free(monkeypatch):
    import torch

    from edgerl.hw import device
    from edgerl.hw.cpus import CpuLoad

    monkeypatch.setattr(device, "torch_default_threads", lambda: 2)
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(device, "cpu_load", lambda: CpuLoad(2, 1.8, 5.0))
        assert device.latency_threads() == (1, "2 CPUs, 1.8 busy with other work")
        assert torch.get_num_threads() == 1
        monkeypatch.setattr(device, "cpu_load", lambda: CpuLoad(2, 0.1, 5.0))
        assert device.latency_threads()[0] == 2
    finally:
        torch.set_num_threads(before)


def test_an_interrupted_export_leaves_no_file_under_its_names(cli, pong_run, tmp_path, monkeypatch):
    """Ctrl-C while ONNX Runtime is checked against PyTorch: the file was written, not verified."""
    from edgerl.export import run as export_run

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(export_run, "check_agreement", interrupted)
    out = tmp_path / "out"
    r = cli("export", "--run-dir", pong_run, "--onnx", "-o", out)
    last = r.err.strip().splitlines()[-1]
    assert r.code == 130 and last.startswith("interrupted: nothing was written"), r.err
    assert list(out.iterdir()) == []  # no .onnx, no .json, no temporary file
    monkeypatch.undo()
    r = cli("export", "--run-dir", pong_run, "--onnx", "-o", out)  # the same export, to the end
    assert r.code == 0, r.err
    assert sorted(p.name for p in out.iterdir()) == [
        "policy-Pong-v5-step400.onnx",
        "policy-Pong-v5-step400.onnx.json",
    ]


@pytest.mark.parametrize("missing", ["onnx", "onnxruntime"])
def test_export_without_onnx_says_so_before_any_work(cli, pong_run, tmp_path, monkeypatch, missing):
    import sys

    monkeypatch.setitem(sys.modules, missing, None)  # import fails as if not installed
    r = cli("export", "--run-dir", pong_run, "--onnx", "-o", tmp_path / "out")
    assert r.code == 2 and "pip install 'edgerl[export]'" in r.err, r.err
    assert "collecting" not in r.err  # no observations played for a check that cannot run
    assert not (tmp_path / "out").exists()
