"""The software stack: Python, PyTorch and its CUDA, the GPU, the precision ``auto`` picks, the
game, PyTorch's CPU threads against the machine's load, replay memory, ONNX Runtime and
TensorRT."""

from __future__ import annotations

import platform as pyplatform
import sys

from edgerl.doctor.core import Check, Context

PYTHON_FLOOR = (3, 10)
GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")


def check_python(ctx: Context) -> Check:
    """Python 3.10 or newer: what ale-py's vector env and edgerl need (JetPack 6 has 3.10)."""
    found = f"Python {pyplatform.python_version()} ({sys.executable})"
    if sys.version_info[:2] >= PYTHON_FLOOR:
        return Check("python", "pass", found, data={"version": pyplatform.python_version()})
    return Check(
        "python",
        "fail",
        found,
        "edgerl needs Python 3.10 or newer (JetPack 6 has 3.10, JetPack 7 3.12); see "
        "Supported platforms in docs/install.md",
    )


def check_torch(ctx: Context) -> Check:
    """PyTorch against the floor (:mod:`edgerl.hw.versions`, which reads NVIDIA's pre-release
    version strings); later checks that need torch skip unless it passes."""
    import torch

    from edgerl.hw.versions import PlatformError, check_torch

    version = torch.__version__
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU build"
    data = {"version": version, "cuda": torch.version.cuda}
    try:
        check_torch(version)
    except PlatformError as e:
        return Check("torch", "fail", f"PyTorch {version} ({build}) is too old", str(e), data)
    ctx.torch_ok = True
    return Check("torch", "pass", f"PyTorch {version} ({build})", data=data)


def check_cuda(ctx: Context) -> Check:
    """Whether torch can use a CUDA GPU; sets ``ctx.device`` to what training would use (the
    config's ``perf.device``)."""
    import torch

    from edgerl.errors import DeviceError
    from edgerl.hw.device import resolve_device
    from edgerl.hw.platform import nvml_gpu_name

    if not ctx.torch_ok:
        return Check("cuda", "skip", "needs a supported PyTorch (see the torch line)")
    wanted = ctx.cfg.perf.device
    if wanted == "cpu":
        ctx.device = resolve_device("cpu")
        return Check("cuda", "skip", "perf.device=cpu: trains on the CPU")
    try:
        ctx.device = resolve_device(wanted)
    except DeviceError as e:  # training would refuse to start: the same sentence
        fix = "check the driver (nvidia-smi), or train on the CPU with perf.device=cpu"
        return Check("cuda", "fail", str(e), fix)
    jetson = ctx.platform is not None and ctx.platform.is_jetson
    if ctx.device.type == "cuda":
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        cudnn_text = _cudnn(cudnn) if cudnn else "no cuDNN"
        return Check(
            "cuda",
            "pass",
            f"CUDA {torch.version.cuda}, cuDNN {cudnn_text}, {torch.cuda.device_count()} "
            f"device(s); training runs on {ctx.device}",
            data={"cuda": torch.version.cuda, "cudnn": cudnn, "device": str(ctx.device)},
        )
    gpu = None if jetson else nvml_gpu_name()
    if torch.version.cuda is None:
        if jetson:
            return Check(
                "cuda",
                "fail",
                f"PyTorch {torch.__version__} is a CPU build: the Jetson's GPU is not used",
                "install NVIDIA's PyTorch wheel for your JetPack (scripts/install.sh says how)",
            )
        if gpu:
            return Check(
                "cuda",
                "warn",
                f"an NVIDIA GPU ({gpu}) is here but PyTorch {torch.__version__} is a CPU build: "
                "training runs on the CPU",
                "install a CUDA build of PyTorch (https://pytorch.org/get-started/locally/)",
            )
        return Check("cuda", "skip", "a CPU build of PyTorch and no NVIDIA GPU: trains on the CPU")
    if jetson or gpu:
        return Check(
            "cuda",
            "fail",
            f"PyTorch is built for CUDA {torch.version.cuda} but torch.cuda.is_available() is "
            f"False{f' with {gpu} present' if gpu else ''}",
            "check the driver (nvidia-smi on a desktop; on a Jetson, that the user is in the "
            "video group and JetPack's CUDA is installed)",
        )
    return Check("cuda", "skip", f"CUDA {torch.version.cuda} build, no GPU: trains on the CPU")


def _cudnn(version: int) -> str:
    """cuDNN's integer version as text: 90300 -> 9.3.0, 8907 -> 8.9.7."""
    if version >= 90000:  # 9.x encodes major*10000 + minor*100 + patch
        return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    return f"{version // 1000}.{version // 100 % 10}.{version % 100}"


def check_gpu(ctx: Context) -> Check:
    """The GPU, its compute capability, and whether this torch has kernels for it."""
    import torch

    from edgerl.hw.device import fast_fp16
    from edgerl.words import fmt_bytes

    device = ctx.device
    if device is None or device.type != "cuda":
        return Check("gpu", "skip", "no CUDA GPU in use")
    name = torch.cuda.get_device_name(device)
    cap = torch.cuda.get_device_capability(device)
    total = torch.cuda.get_device_properties(device).total_memory
    arch = f"sm_{cap[0]}{cap[1]}"
    archs = torch.cuda.get_arch_list()
    found = (
        f"{name}, compute {cap[0]}.{cap[1]}, {fmt_bytes(total)}, fast FP16 "
        f"{'yes' if fast_fp16(cap) else 'no'}"
    )
    data = {"name": name, "capability": list(cap), "memory_bytes": total, "archs": archs}
    fix = f"install a PyTorch built for compute {cap[0]}.{cap[1]} (on a Jetson, NVIDIA's wheel)"
    try:
        x = torch.arange(8.0, device=device)
        ran = float((x * 2).sum()) == 56.0
    except Exception as e:  # "no kernel image is available for execution on the device"
        return Check("gpu", "fail", f"{found}; a CUDA kernel does not run: {e}", fix, data)
    if not ran:
        return Check("gpu", "fail", f"{found}; a CUDA kernel computed a wrong sum", fix, data)
    native = compatible_arch(cap, archs)
    if native is not None:
        return Check("gpu", "pass", f"{found}; this PyTorch has {native} kernels", data=data)
    return Check(
        "gpu",
        "warn",
        f"{found}; this PyTorch has no {arch} kernels ({', '.join(archs) or 'none listed'}): "
        "it runs through PTX compilation, slow to start",
        fix,
        data,
    )


def compatible_arch(capability: tuple[int, int], archs: list[str]) -> str | None:
    """The ``sm_XY`` of ``archs`` whose kernels run natively on a GPU of ``capability``: the
    same major version and a minor no newer (``sm_80`` kernels run on 8.6, not on 9.0)."""
    major, minor = capability
    native = [
        (int(a[3:-1]), int(a[-1]), a)
        for a in archs
        if a.startswith("sm_") and a[3:].isdigit() and len(a) >= 5
    ]
    fits = [(m, n, a) for m, n, a in native if m == major and n <= minor]
    return max(fits)[2] if fits else None


def check_precision(ctx: Context) -> Check:
    """What ``perf.amp=auto`` and ``perf.cuda_graphs=auto`` choose on this device."""
    import torch

    from edgerl.hw.device import integrated_gpu, resolve_amp, resolve_cuda_graphs

    device = ctx.device
    if device is None:
        return Check("precision", "skip", "needs a usable device (see the cuda line)")
    amp = resolve_amp("auto", device)
    graphs = resolve_cuda_graphs("auto", device, amp)
    amp_name = str(amp).removeprefix("torch.") if amp is not None else None
    data = {"device": str(device), "amp": amp_name, "cuda_graphs": graphs}
    if device.type != "cuda":
        from edgerl.hw.platform import cpu_bf16_flags

        flags = cpu_bf16_flags()
        data["cpu_bf16"] = list(flags)
        found = "CPU: fp32, channels_last convolutions, no CUDA graph (perf.amp/cuda_graphs=auto); "
        found += (
            f"bf16 in hardware ({', '.join(flags)}): perf.amp=bf16 uses it"
            if flags
            else "no bf16 in hardware (fp32 only)"
        )
        return Check("precision", "pass", found, data=data)
    cap = torch.cuda.get_device_capability(device)
    if amp is None and not integrated_gpu(device):
        if cap >= (8, 0):
            precision = (
                f"fp32 with TF32 convolutions (compute {cap[0]}.{cap[1]}; on a discrete GPU bf16 "
                "did not pay at these sizes on an H100 and an H200; perf.amp=bf16 asks for it)"
            )
        else:
            precision = (
                f"fp32 (compute {cap[0]}.{cap[1]}; on a discrete GPU auto keeps fp32, not "
                "measured before Ampere; perf.amp=fp16 asks for fp16 with a grad scaler)"
            )
    elif amp is None:
        precision = f"fp32 (compute {cap[0]}.{cap[1]} has no fast FP16)"
    else:
        precision = f"{amp_name} convolutions with fp32 Q-values (compute {cap[0]}.{cap[1]})"
    graph = "the update captured as a CUDA graph" if graphs else "no CUDA graph (fp16 grad scaler)"
    return Check("precision", "pass", f"perf.amp=auto: {precision}; {graph}", data=data)


def check_game(ctx: Context) -> Check:
    """The configured game loads (ale-py and its ROM); sets ``ctx.spec`` and applies the presets
    of its observation kind to ``ctx.cfg``."""
    import ale_py

    from edgerl.config.presets import apply_presets
    from edgerl.envs import probe
    from edgerl.envs.actions import numbers
    from edgerl.learners.factory import check_keys

    spec = probe(ctx.cfg.env)
    cfg = apply_presets(ctx.cfg, spec.kind, spec.continuous)
    check_keys(cfg)
    ctx.spec, ctx.cfg = spec, cfg
    shape = "x".join(map(str, spec.obs_shape))
    if spec.continuous:
        actions = f"actions of {numbers(spec)} within bounds"
    else:
        actions = f"{spec.num_actions} actions"
    return Check(
        "game",
        "pass",
        f"{spec.id} (ale-py {ale_py.__version__}): {actions}, observations {shape} "
        f"{spec.obs_dtype}",
        data={"env": spec.id, "ale_py": ale_py.__version__},
    )


def check_threads(ctx: Context) -> Check:
    """PyTorch's CPU threads (``perf.threads``, after the game's presets) against the CPUs that
    the machine's load leaves free: more threads than free CPUs slow training many times."""
    from edgerl.hw.device import cpu_load, oversubscription, resolve_threads

    setting = ctx.cfg.perf.threads
    load = cpu_load()
    threads = resolve_threads(setting, load)
    data = {"setting": setting, "threads": threads, "cpus": load.cpus, "load": load.load}
    how = "auto" if setting == 0 else "perf.threads"
    found = f"{threads} PyTorch thread(s) ({how}); {load.describe()}"
    warning = oversubscription(threads, load)
    if warning:
        return Check("cpu threads", "warn", warning, "perf.threads=0", data)
    if load.load > load.cpus:
        return Check(
            "cpu threads",
            "warn",
            f"{found}: the machine is busier than its CPUs, so training shares them and runs "
            "slower",
            "stop other work on this machine if training should have it to itself",
            data,
        )
    return Check("cpu threads", "pass", found, data=data)


def check_replay_memory(ctx: Context) -> Check:
    """Whether the learner's memory (DQN's replay, PQN's rollout) fits on its device."""
    from edgerl.learners.factory import memory_fix, memory_plan

    spec, cfg, device = ctx.spec, ctx.cfg, ctx.device
    if spec is None or device is None:
        return Check("replay memory", "skip", "needs the game and a device (see above)")
    plan, found = memory_plan(cfg, spec, device)
    data = {
        "algo": cfg.agent.algo,
        "capacity": plan.capacity,
        "bytes": plan.total_bytes,
        "available_bytes": plan.available_bytes,
    }
    if plan.fits:
        return Check("replay memory", "pass", found, data=data)
    return Check("replay memory", "fail", found, memory_fix(cfg, plan), data)


def check_onnx(ctx: Context) -> Check:
    """onnx and ONNX Runtime (for `edgerl export` and playing ONNX policies) and its providers."""
    try:
        import onnx
        import onnxruntime as ort
    except ImportError as e:
        return Check(
            "onnxruntime",
            "warn",
            f"{e.name} is not installed: edgerl export and ONNX policies need it (training "
            "does not)",
            "pip install 'edgerl[export]'",
        )
    available = ort.get_available_providers()
    names = ", ".join(p.removesuffix("ExecutionProvider") for p in available)
    found = f"onnx {onnx.__version__}, onnxruntime {ort.__version__} (providers: {names})"
    data = {"onnx": onnx.__version__, "onnxruntime": ort.__version__, "providers": available}
    cuda = ctx.device is not None and ctx.device.type == "cuda"
    if cuda and not any(p in available for p in GPU_PROVIDERS):
        return Check(
            "onnxruntime",
            "warn",
            f"{found}: ONNX policies play on the CPU, not the GPU",
            "pip install onnxruntime-gpu (on a Jetson, the build for your JetPack from "
            "NVIDIA's Jetson AI Lab index); TensorRT engines use the GPU either way",
            data,
        )
    return Check("onnxruntime", "pass", found, data=data)


def check_tensorrt(ctx: Context) -> Check:
    """TensorRT for `edgerl export --trt`: importable, new enough, with a GPU to build on."""
    from edgerl.hw.device import fast_fp16
    from edgerl.policies.tensorrt import flavor

    jetson = ctx.platform is not None and ctx.platform.is_jetson
    cuda = ctx.device is not None and ctx.device.type == "cuda"
    try:
        import tensorrt as trt
    except ImportError:
        if jetson:
            return Check(
                "tensorrt",
                "warn",
                "TensorRT is not importable from this Python: edgerl export --trt cannot build "
                "engines (--onnx works)",
                "JetPack ships it (python3-libnvinfer): make the venv with "
                "--system-site-packages, as scripts/install.sh does",
            )
        if cuda:
            return Check(
                "tensorrt",
                "warn",
                "TensorRT is not installed: edgerl export --trt cannot build engines (--onnx "
                "works)",
                "pip install tensorrt",
            )
        return Check(
            "tensorrt",
            "skip",
            "not installed, and no CUDA GPU: engines are built on the GPU that runs them",
        )
    except Exception as e:  # the module is there but its libraries do not load
        return Check(
            "tensorrt",
            "fail",
            f"import tensorrt failed: {type(e).__name__}: {e}",
            "reinstall TensorRT for this CUDA (on a Jetson: sudo apt install --reinstall "
            "python3-libnvinfer)",
        )
    version = trt.__version__
    fl = flavor(version)  # ExportError for TensorRT older than 8.5: a fail line
    data = {"version": version}
    if not cuda:
        return Check(
            "tensorrt",
            "warn",
            f"TensorRT {version} is installed but no CUDA GPU is usable: it cannot build engines",
            "see the cuda line",
            data,
        )
    import torch

    cap = torch.cuda.get_device_capability(ctx.device)
    precisions = ["fp32"] + (["fp16"] if fast_fp16(cap) or fl.strongly_typed else [])
    precisions += ["int8"] if fl.int8_calibration else []
    return Check(
        "tensorrt",
        "pass",
        f"TensorRT {version}: engines in {', '.join(precisions)}",
        data={**data, "precisions": precisions},
    )
