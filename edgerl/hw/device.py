"""Which device trains and how: CUDA or the CPU, mixed precision, CUDA graphs, backend settings.

* CUDA: cuDNN autotuning (the TX1 experiment behind this project went from 46 s to 37 s per 1000
  steps with it), TF32, mixed precision (``perf.amp``: under auto, on a Jetson bf16 from Orin on
  and fp16 with a grad scaler on Xavier and Nano; fp32 on discrete GPUs, see
  :func:`resolve_amp`) and CUDA graphs (``perf.cuda_graphs``; not with the fp16 grad scaler, which
  syncs with the CPU every step).
* CPU: full precision; PyTorch's thread count (``perf.threads``; 0 picks it from the CPUs the
  machine's load leaves free, see :func:`resolve_threads`).
* Either: glibc's allocator keeping freed memory for the next update
  (:mod:`edgerl.hw.allocator`).
"""

from __future__ import annotations

import functools
import logging
import math
import os

import psutil
import torch

from edgerl.config import Config
from edgerl.errors import ConfigError, DeviceError
from edgerl.hw.allocator import keep_freed_memory
from edgerl.hw.cpus import CpuLoad, cpu_load, usable_cpus
from edgerl.hw.platform import cpu_bf16_flags
from edgerl.hw.versions import check_torch

log = logging.getLogger(__name__)


# Calls of a function on a side stream before its CUDA graph is captured: allocations, cuDNN's
# autotuning and lazy initialisation happen there, not inside the capture.
CUDA_GRAPH_WARMUP = 3


def resolve_device(name: str) -> torch.device:
    """The torch device for ``perf.device``; raises DeviceError if CUDA is asked but unusable.

    A CUDA device is returned with its index (``cuda:0``): several torch calls (memory queries,
    RNG state) refuse a device without one on the torch releases JetPack ships. Raises
    PlatformError first if torch is older than edgerl supports.
    """
    check_torch(torch.__version__)
    if name == "cpu":
        return torch.device("cpu")
    try:
        usable = torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if usable else None
    except Exception as e:  # a broken driver or CUDA install raises here, not in is_available()
        raise DeviceError(
            f"cannot use the CUDA GPU ({type(e).__name__}: {e}); check the driver with "
            "edgerl doctor, or use perf.device=cpu"
        ) from None
    if name == "cuda" and not usable:
        raise DeviceError(
            "perf.device=cuda but no usable CUDA GPU was found (torch.cuda.is_available() is "
            f"False for torch {torch.__version__}); use perf.device=auto or cpu"
        )
    return device if device is not None else torch.device("cpu")


def indexed(device: torch.device | str) -> torch.device:
    """``device`` with its index: ``cuda`` becomes ``cuda:<current device>``.

    Tensors always report an indexed device (``cuda:0``), and ``torch.device("cuda")`` does not
    compare equal to it.
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def same_device(a: torch.device | str, b: torch.device | str) -> bool:
    """Whether ``a`` and ``b`` name one device: ``cuda`` is the same as ``cuda:<current>``.

    ``torch.device("cuda") == torch.device("cuda:0")`` is False, so comparing as they are would
    take a learner made on ``cuda`` and a replay on ``cuda:0`` for two devices.
    """
    return indexed(a) == indexed(b)


def integrated_gpu(device: torch.device) -> bool:
    """True for a CUDA GPU that shares the host's memory (a Jetson's)."""
    if device.type != "cuda":
        return False
    try:
        return bool(torch.cuda.get_device_properties(device).is_integrated)
    except Exception:  # an old torch without the field, or a driver problem: assume separate
        return False


def resolve_pin_threads(setting: str, device: torch.device) -> str:
    """``env.pin_threads`` made "on" or "off": auto is on with an integrated GPU (a Jetson's:
    its cores are the emulators' and the Python loop's) and three CPUs or more."""
    if setting != "auto":
        return setting
    return "on" if integrated_gpu(device) and usable_cpus() >= 3 else "off"


def host_event(device: torch.device | None = None) -> torch.cuda.Event:
    """A CUDA event the host waits on (``synchronize``). On an integrated GPU (a Jetson's) the
    waiting thread sleeps (``blocking=True``) instead of spinning: the CPU cores are the
    emulators'. On a GPU of its own it spins, for the lower latency."""
    return torch.cuda.Event(blocking=_integrated(device or torch.device("cuda")))


@functools.lru_cache(maxsize=16)
def _integrated(device: torch.device) -> bool:
    return integrated_gpu(device)  # False where no CUDA is (a stand-in's events in the tests)


def torch_default_threads() -> int:
    """The thread count PyTorch picks by itself: ``OMP_NUM_THREADS``, else the physical cores."""
    try:
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    except (KeyError, ValueError):
        return min(psutil.cpu_count(logical=False) or usable_cpus(), usable_cpus())


def resolve_threads(setting: int, load: CpuLoad | None = None) -> int:
    """PyTorch's CPU thread count for ``perf.threads``: the setting, or for 0 (auto) the CPUs the
    load leaves free, at least 1 and at most what PyTorch would pick by itself.

    Why not PyTorch's own choice: a parallel region ends when its slowest thread does, and on a
    machine whose other work takes the cores one of its threads is usually waiting for one.
    CartPole on 2 busy cores trained at 43 steps/s with PyTorch's 2 threads and at 557 with one
    (docs/performance.md, "PyTorch's threads on a busy machine").
    """
    if setting > 0:
        return setting
    load = load or cpu_load()
    return max(1, min(torch_default_threads(), load.free))


def oversubscription(threads: int, load: CpuLoad | None = None) -> str | None:
    """A sentence when PyTorch's ``threads`` need more CPUs than the load leaves free (each
    parallel region then waits for a preempted thread), else None. For ``edgerl doctor`` and
    ``edgerl bench``, and the training log."""
    if threads <= 1:
        return None
    load = load or cpu_load()
    if threads <= max(1, load.free):
        return None
    return (
        f"PyTorch runs {threads} threads but {load.describe()} leaves "
        f"{load.free} free: every parallel region waits for a thread that is not running, and "
        f"training slows many times over; use perf.threads=0 (auto: "
        f"{resolve_threads(0, load)} now) or stop the other work"
    )


def describe_threads(setting: int, load: CpuLoad | None = None) -> str:
    """PyTorch's thread count as set, for the training log: ``1 torch thread (auto; 2 CPUs, load
    average 4.8)``; ``load``: the one it was chosen by (None: the CPUs now)."""
    count = torch.get_num_threads()
    how = "auto" if setting == 0 else "perf.threads"
    noun = "thread" if count == 1 else "threads"
    return f"{count} torch {noun} ({how}; {(load or cpu_load()).describe()})"


def configure_backends(device: torch.device, threads: int = 0, deterministic: bool = False) -> int:
    """Process-wide speed settings for ``device``: cuDNN autotuning, TF32, and PyTorch's CPU
    threads (:func:`resolve_threads`); returns the thread count set. ``deterministic``
    (``perf.deterministic``) asks PyTorch for deterministic kernels instead of cuDNN's
    autotuning (a warning where an operation has none)."""
    if deterministic:
        # cuBLAS needs this before its first call to repeat its sums (PyTorch's reproducibility
        # notes); a value the user set wins.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    load = cpu_load()
    count = resolve_threads(threads, load)
    torch.set_num_threads(count)
    if threads > 0:
        warning = oversubscription(count, load)
        if warning:
            log.warning("%s", warning)
    else:  # said at INFO once set-up succeeded (describe_threads): an error comes alone
        log.debug("torch threads: %d (perf.threads=0: auto, %s)", count, load.describe())
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = not deterministic
        torch.backends.cudnn.deterministic = deterministic
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return count


def learner_threads(cfg: Config) -> int:
    """``perf.threads``, except that a fleet's actors on a Ray instance started here take their
    CPUs from this machine first: the learner gets the rest (at least one). A preempted thread
    stalls every parallel region of the update, so the learner must not count on cores the
    actors use. With ``perf.deterministic``, auto is one thread, whatever the machine and its
    load: sums over another number of threads are other sums, and one thread is never
    preempted in the middle of a parallel region."""
    fleet = cfg.fleet
    if cfg.perf.deterministic and not cfg.perf.threads:
        return 1
    if cfg.perf.threads or not fleet.actors or fleet.address:
        return cfg.perf.threads
    taken = math.ceil(fleet.actors * fleet.cpus_per_actor)
    return max(1, usable_cpus() - taken)


def configure_for_training(device: torch.device, cfg: Config) -> int:
    """:func:`configure_backends` with what training uses (:func:`learner_threads`,
    ``perf.deterministic``), and freed memory kept for the next update
    (:func:`~edgerl.hw.allocator.keep_freed_memory`): the trainer, ``edgerl bench``, the
    calibration and ``edgerl doctor`` all call this, so that what they measure runs as training
    would."""
    keep_freed_memory()
    return configure_backends(device, learner_threads(cfg), deterministic=cfg.perf.deterministic)


def latency_threads() -> tuple[int, str]:
    """Set PyTorch's CPU threads for measuring a policy's latency as training chooses them
    (:func:`resolve_threads`: the CPUs other work leaves free); returns the count and the load
    it was chosen under, which every latency figure is shown with. On 2 cores with a load of 4,
    the default two threads made a batch-1 action take 46.9 ms at the median, one thread 2.1."""
    load = cpu_load()
    count = resolve_threads(0, load)
    torch.set_num_threads(count)
    return count, load.describe()


def fast_fp16(capability: tuple[int, int]) -> bool:
    """Whether a GPU of this compute capability runs FP16 at least twice as fast as FP32.

    5.3 (Nano, TX1), 6.0, 6.2 (TX2), 7.x (Xavier), 8.x (Orin) and newer do; desktop Maxwell (5.0,
    5.2) and consumer Pascal (6.1) do not.
    """
    return capability == (5, 3) or capability in ((6, 0), (6, 2)) or capability >= (7, 0)


def resolve_amp(
    setting: str,
    device: torch.device,
    capability: tuple[int, int] | None = None,
    frames: bool = True,
    integrated: bool | None = None,
) -> torch.dtype | None:
    """The autocast dtype for ``perf.amp`` on ``device`` (None: full precision).

    ``auto`` keeps networks for vector observations (``frames`` False) in fp32: their inputs
    lose precision in bf16 and a small MLP's update gains nothing. It keeps discrete GPUs in fp32
    (TF32 convolutions) too: the Nature CNN's kernels at edgerl's batch sizes are too small for
    bf16 to pay, and its casts are more kernels and more host work. Measured on an H200 (one run
    each): the CUDA-graph update at batch 32 made 1,824 updates/s in bf16 against 1,984 in fp32,
    and PQN's Pong loop ran 1.19x as fast in fp32; an H100 earlier gave the same direction.
    ``auto`` keeps bf16 (fp16 before Ampere) on integrated GPUs, a Jetson's, where memory is
    shared with the CPU and the GPU is small: not measured on a board yet. ``integrated`` is read
    from the device when not given. Raises ConfigError for a precision the device cannot do.
    """
    if setting == "off" or (setting == "auto" and not frames):
        return None
    if device.type != "cuda":
        if setting == "auto":
            # fp32 until seeds show bf16 learns as well (CPUs without bf16 in hardware run
            # autocast slower than fp32; with AMX the Nature CNN's update ran about 1.6x).
            return None
        if setting == "bf16":
            if cpu_bf16_flags():
                return torch.bfloat16
            raise ConfigError(
                "perf.amp=bf16 on a CPU needs bf16 arithmetic in hardware (x86's amx_bf16 or "
                "avx512_bf16, Arm's bf16 among /proc/cpuinfo's flags), and this CPU has none: "
                "use perf.amp=off"
            )
        raise ConfigError(f"perf.amp={setting} needs a CUDA GPU; use perf.amp=bf16, auto or off")
    cap = capability or torch.cuda.get_device_capability(device)
    bf16_ok = cap >= (8, 0)
    if setting == "bf16":
        if not bf16_ok:
            raise ConfigError(
                f"perf.amp=bf16 needs compute capability 8.0 or newer (this GPU is "
                f"{cap[0]}.{cap[1]}); use perf.amp=fp16 or auto"
            )
        return torch.bfloat16
    if setting == "fp16":
        return torch.float16
    if not (integrated_gpu(device) if integrated is None else integrated):
        return None
    if bf16_ok:
        return torch.bfloat16
    return torch.float16 if fast_fp16(cap) else None


def precision_name(amp: torch.dtype | None) -> str:
    """The word the runs on record use for an autocast dtype (:func:`resolve_amp`'s answer):
    fp32 for full precision (TF32 convolutions on a GPU included), bf16, fp16."""
    if amp is torch.bfloat16:
        return "bf16"
    return "fp16" if amp is torch.float16 else "fp32"


def precision_of(setting: str, device: torch.device, frames: bool = True) -> str:
    """The precision ``perf.amp = setting`` trains in on ``device`` (:func:`precision_name` of
    :func:`resolve_amp`); raises ConfigError for one the device cannot do."""
    return precision_name(resolve_amp(setting, device, frames=frames))


def resolve_cuda_graphs(setting: str, device: torch.device, amp: torch.dtype | None) -> bool:
    """Whether to capture the update as a CUDA graph; raises ConfigError for impossible asks."""
    if setting == "off" or device.type != "cuda":
        if setting == "on" and device.type != "cuda":
            raise ConfigError("perf.cuda_graphs=on needs a CUDA GPU; use auto or off")
        return False
    if amp is torch.float16:
        if setting == "on":
            raise ConfigError(
                "perf.cuda_graphs=on cannot capture the fp16 grad scaler (it syncs with the CPU "
                "every step); use perf.amp=bf16 or off, or perf.cuda_graphs=auto"
            )
        return False
    return True


def make_grad_scaler() -> torch.amp.GradScaler | torch.cuda.amp.GradScaler:
    """A CUDA grad scaler for fp16 training.

    ``torch.amp.GradScaler`` is the current name; NVIDIA's JetPack 6.0 builds (torch 2.3
    pre-releases) may predate it and only have ``torch.cuda.amp.GradScaler``.
    """
    scaler = getattr(torch.amp, "GradScaler", None)
    if scaler is not None:
        return scaler("cuda")
    return torch.cuda.amp.GradScaler()
