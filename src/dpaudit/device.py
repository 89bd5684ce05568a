"""The one device choice: where models train and features are computed.

- :func:`resolve` turns a config's ``device`` into a ``torch.device``: it claims a card
  among several (:func:`claim_first`), makes it the current CUDA device, and refuses to
  fall back to the CPU in a job that was given a GPU (:func:`given_gpus`).
- :func:`describe` is what provenance records about the device actually used.
- :func:`deterministic` is the scope in which CUDA computations are bitwise reproducible.
- :func:`is_gpu`, :func:`gpu_count` and :func:`memory_info` are what code asks instead
  of ``dev.type == "cuda"``, ``torch.cuda.device_count`` and ``torch.cuda.mem_get_info``,
  so that a *forced GPU description* (:class:`GpuDescription`) takes every GPU-only
  branch on a machine without a GPU: GPUs are rarely at hand, and code run only there
  went untested. Force one in process with :func:`forced_gpu`, or for subprocesses (a
  benchmark, a CLI job, a workflow, the dry run of a GPU script) with
  :data:`FORCE_GPU_VAR` holding the description's fields as a JSON object::

      DPAUDIT_FORCE_GPU='{"name": "NVIDIA H100 80GB HBM3", "total_memory": 85899345920,
                          "free_memory": 85899345920, "capability": "9.0", "sm_count": 132}'

  (``count``, the cards, is optional: 1). While forced, ``cuda`` and ``auto`` resolve to
  the CPU, where the work runs, the CPU counts as the described GPU (memory sizing, TF32's
  clip margin, card claims, the workflow's GPU places), and :func:`describe` records
  ``device: cpu`` with ``forced_gpu``, so that nothing trained in a dry run is restored as
  GPU work.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Iterator, Mapping, Sequence

if TYPE_CHECKING:
    import torch

#: Names a config or CLI may give (``auto``: CUDA when torch sees a GPU, else the CPU).
DEVICES = ("auto", "cpu", "cuda")
#: Where the processes of one user claim GPUs (:func:`claim_first`).
LOCK_DIR = Path(tempfile.gettempdir()) / f"dpaudit-gpus-{os.getuid()}"
#: Environment variables through which a job is handed GPUs: ``CUDA_VISIBLE_DEVICES``
#: naming a device, SLURM's for ``--gpus``/``--gres=gpu`` (:func:`given_gpus`).
GPU_VARS = ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS_ON_NODE")
#: The keys of :func:`describe` that fix what a seed trains bit for bit (the kernels that
#: compute its products; its random draws are the same on every device);
#: ``device`` also names the card's index, which does not.
REPRODUCE_KEYS = ("gpu_name", "capability", "sm_count", "torch", "cuda")
#: cuBLAS workspace setting that torch requires for deterministic CUDA matmuls.
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")
#: How many training jobs share one GPU (:func:`jobs_per_gpu`): the workflow sets it from
#: the config's ``jobs_per_gpu`` for the jobs of a local run.
JOBS_PER_GPU_VAR = "DPAUDIT_JOBS_PER_GPU"
#: A :class:`GpuDescription` as a JSON object of its fields: the GPU that a process (and
#: the processes it starts) takes every GPU-only branch for, on the CPU (:func:`forced`).
FORCE_GPU_VAR = "DPAUDIT_FORCE_GPU"


_FIX = ("make CUDA usable in this job (a CUDA build of torch, a working driver), or set "
        "device cpu (config jagielski.device, CLI --device) to train on the CPU on purpose")


class DeviceUnavailable(RuntimeError):
    """The requested or allocated device cannot be used here."""


# The GPU this process claimed, with the open lock file that holds the claim until exit.
_claimed: tuple[torch.device, IO | None] | None = None


@dataclasses.dataclass(frozen=True)
class GpuDescription:
    """A GPU as the GPU-only branches see it, forced on the CPU (:func:`forced_gpu`,
    :data:`FORCE_GPU_VAR`): its ``name`` (``torch.cuda.get_device_name``), memory in bytes
    (``total_memory``, and ``free_memory`` as ``torch.cuda.mem_get_info`` would report it
    now), compute ``capability`` (``"9.0"``), ``sm_count`` (multiprocessors) and how many
    such cards torch would see (``count``). A field of the wrong type or range is a
    ValueError naming it."""

    name: str
    total_memory: int
    free_memory: int
    capability: str
    sm_count: int
    count: int = 1

    def __post_init__(self):
        def whole(value):
            return isinstance(value, int) and not isinstance(value, bool)
        checks = (
            ("name", isinstance(self.name, str) and self.name.strip() != "",
             "a non-empty string"),
            ("total_memory", whole(self.total_memory) and self.total_memory > 0,
             "an integer > 0 (bytes)"),
            ("free_memory", whole(self.free_memory) and whole(self.total_memory)
             and 0 <= self.free_memory <= self.total_memory,
             "an integer of bytes from 0 to total_memory"),
            ("capability", isinstance(self.capability, str)
             and re.fullmatch(r"\d+\.\d+", self.capability) is not None,
             'a string "major.minor" such as "9.0"'),
            ("sm_count", whole(self.sm_count) and self.sm_count >= 1, "an integer >= 1"),
            ("count", whole(self.count) and self.count >= 1, "an integer >= 1"))
        for field, ok, allowed in checks:
            if not ok:
                raise ValueError(f"GpuDescription {field}={getattr(self, field)!r}: must be "
                                 f"{allowed}")


#: The fields of :data:`FORCE_GPU_VAR`'s JSON object (``count`` may be left out).
GPU_FIELDS = tuple(f.name for f in dataclasses.fields(GpuDescription))
# The description forced_gpu() holds; it takes precedence over FORCE_GPU_VAR.
_forced: GpuDescription | None = None


def forced() -> GpuDescription | None:
    """The GPU description forced on this process: :func:`forced_gpu`'s within its scope,
    else :data:`FORCE_GPU_VAR`'s (read on each call, so a test may set it), else None. A
    variable that is not a JSON object of :data:`GPU_FIELDS` with valid values is a
    ValueError naming it and the fields."""
    if _forced is not None:
        return _forced
    text = os.environ.get(FORCE_GPU_VAR, "").strip()
    if not text:
        return None
    try:
        fields = json.loads(text)
        if not isinstance(fields, dict):
            raise ValueError("not a JSON object")
        unknown = sorted(set(fields) - set(GPU_FIELDS))
        missing = [f.name for f in dataclasses.fields(GpuDescription)
                   if f.default is dataclasses.MISSING and f.name not in fields]
        if unknown or missing:
            raise ValueError(", ".join([f"unknown field(s) {unknown}"] * bool(unknown)
                                       + [f"missing field(s) {missing}"] * bool(missing)))
        return GpuDescription(**fields)
    except ValueError as exc:  # json's decode errors are ValueErrors too
        raise ValueError(f"{FORCE_GPU_VAR}={text!r}: {exc}; must be a JSON object with the "
                         f"fields {list(GPU_FIELDS)} (count optional, default 1)") from None


@contextmanager
def forced_gpu(description: GpuDescription) -> Iterator[GpuDescription]:
    """Within this scope the CPU stands for the GPU ``description`` (:func:`forced`), with
    a card claim of its own (:func:`resolve`), released on exit; the previous description
    and claim are restored."""
    global _forced, _claimed
    if not isinstance(description, GpuDescription):
        raise TypeError(f"forced_gpu: a GpuDescription, not {type(description).__name__}")
    saved = _forced, _claimed
    _forced, _claimed = description, None
    try:
        yield description
    finally:
        if _claimed is not None and _claimed[1] is not None:
            _claimed[1].close()
        _forced, _claimed = saved


def is_gpu(dev: str | torch.device) -> bool:
    """Whether work on ``dev`` takes the GPU-only branches: a CUDA device, or the CPU while
    a GPU description is forced (:func:`forced`)."""
    import torch  # here: commands that never train start without it
    kind = torch.device(dev).type
    return kind == "cuda" or (kind == "cpu" and forced() is not None)


def gpu_count() -> int:
    """How many GPUs this process has: the forced description's ``count`` (:func:`forced`),
    else ``torch.cuda.device_count()`` (0 without a usable CUDA). Before torch is imported,
    ``CUDA_VISIBLE_DEVICES`` set and empty hides every GPU from CUDA and ROCm: 0 without
    importing torch (Snakemake's start-up asks; the CPU-only jobs and tests set it). CUDA
    reads the variable once, so after torch is imported it is asked."""
    desc = forced()
    if desc is not None:
        return desc.count
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "" and "torch" not in sys.modules:
        return 0
    import torch  # here: commands that never train start without it
    return torch.cuda.device_count()


def memory_info(dev: str | torch.device) -> tuple[int, int]:
    """``(free, total)`` bytes of the GPU ``dev``: ``torch.cuda.mem_get_info`` on a CUDA
    device, the forced description's on the CPU (:func:`forced`). Any other device has no
    GPU memory to report: a ValueError."""
    import torch  # here: commands that never train start without it
    if torch.device(dev).type == "cuda":
        return torch.cuda.mem_get_info(dev)
    desc = forced()
    if desc is None or torch.device(dev).type != "cpu":
        raise ValueError(f"memory_info({str(dev)!r}): not a GPU, and {FORCE_GPU_VAR} "
                         "describes none")
    return desc.free_memory, desc.total_memory


def resolve(device: str | torch.device | None = None) -> torch.device:
    """``None`` or ``"auto"``: a GPU when torch sees one, else the CPU, except in a job that
    was given a GPU (:func:`given_gpus`), where a CPU fallback (~100x slower, holding the
    GPU) is a :class:`DeviceUnavailable` error. ``"cuda"`` without an index, of several
    GPUs: the first one that no other dpaudit process of this user has claimed
    (:func:`claim_first`: jobs started side by side with ``--resources gpu=N`` each get
    their own of the N GPUs; with :func:`jobs_per_gpu` J > 1, a card has J places, taken
    card after card), or, if all are claimed, the one with the most free memory
    (from NVML, :func:`nvml_free_memory`; without NVML a card picked by process id), the
    same one for the rest of the process. A CUDA result always has an index and is made
    the current device (``torch.cuda.set_device``), so that work placed on plain ``cuda``
    goes there too and no context opens on card 0. Any other name or ``torch.device`` as
    given. Asking for CUDA where torch cannot use it is a :class:`DeviceUnavailable`.
    While a GPU description is forced (:func:`forced`), ``auto`` and ``cuda`` claim a card
    of the description's ``count`` the same way (locks of their own: a dry run takes no
    real card's place) and resolve to the CPU, where the work runs."""
    import torch  # here: commands that never train start without it
    global _claimed
    desc = forced()
    if device is None or device == "auto":
        if desc is None and not torch.cuda.is_available():
            given = given_gpus()
            if given:
                raise DeviceUnavailable(f"device='auto': this job was given a GPU "
                                        f"({_show(given)}) but {_why_no_cuda()}; {_FIX}")
            return torch.device("cpu")
        device = "cuda"
    dev = torch.device(device)
    if dev.type != "cuda":
        return dev
    if desc is None and not torch.cuda.is_available():
        given = given_gpus()
        where = f" (this job was given a GPU: {_show(given)})" if given else ""
        raise DeviceUnavailable(f"device={str(device)!r}: {_why_no_cuda()}{where}; {_FIX}")
    n = gpu_count()
    if dev.index is None:
        if _claimed is None:
            _claimed = _claim(n)
        dev = _claimed[0]
    elif dev.index >= n:
        seen = (f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}"
                if desc is None else f"{FORCE_GPU_VAR} count={desc.count}")
        raise DeviceUnavailable(f"device={str(device)!r}: torch sees {n} CUDA device(s) "
                                f"here ({seen})")
    if desc is not None:
        return torch.device("cpu")
    torch.cuda.set_device(dev.index)
    return dev


def _claim(n: int) -> tuple[torch.device, IO | None]:
    """The card this process takes among ``n`` (see :func:`resolve`), with its lock."""
    import torch  # here: commands that never train start without it
    if n == 1:
        return torch.device("cuda", 0), None
    desc = forced()
    if desc is not None:  # the description's cards, apart from any real card's claims
        names = [f"forced{i}" for i in range(n)]
    else:
        # Global names, so that jobs with different CUDA_VISIBLE_DEVICES agree (properties
        # come from the driver: no context is opened).
        names = [str(getattr(torch.cuda.get_device_properties(i), "uuid", ""))
                 for i in range(n)]
        if len(set(names)) < n or "" in names:
            names = [f"cuda{i}" for i in range(n)]
    # Each card has jobs_per_gpu() places, taken card after card: the first n jobs get a
    # card each, the next n a second place on each, and so on.
    share = jobs_per_gpu()
    slots = names if share == 1 else [f"{name}.{j}" for j in range(share) for name in names]
    pick, lock = claim_first(slots, LOCK_DIR)
    if lock is not None:
        return torch.device("cuda", slots.index(pick) % n), lock
    # Every card claimed: share the freest; without NVML spread processes by id.
    free = nvml_free_memory(n) if desc is None else [desc.free_memory] * n
    index = os.getpid() % n if free is None else max(range(n), key=free.__getitem__)
    return torch.device("cuda", index), None


def jobs_per_gpu(environ: Mapping[str, str] | None = None) -> int:
    """How many training jobs share each GPU: :data:`JOBS_PER_GPU_VAR` in ``environ``
    (default ``os.environ``), which the workflow sets from the config's ``jobs_per_gpu`` for
    a local run; 1 where it is unset (a job run by hand, a SLURM job given its own GPU).
    A job sizes its calls to its share of the card's memory, and on several GPUs takes a
    place on a card (:func:`resolve`). A value that is not an integer >= 1 is a ValueError
    naming the variable."""
    env = os.environ if environ is None else environ
    value = env.get(JOBS_PER_GPU_VAR, "").strip()
    if not value:
        return 1
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{JOBS_PER_GPU_VAR}={value!r}: must be an integer >= 1 (the training "
                         f"jobs that share one GPU; config key jobs_per_gpu)")
    return int(value)


def given_gpus(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of :data:`GPU_VARS` in ``environ`` (default ``os.environ``) that say
    this process was handed GPUs, with their values: ``CUDA_VISIBLE_DEVICES``,
    ``SLURM_JOB_GPUS`` or ``SLURM_STEP_GPUS`` naming a device (an index, ``GPU-...`` or
    ``MIG-...``; ``""``, ``-1`` or ``NoDevFiles`` name none), ``SLURM_GPUS_ON_NODE`` above
    0. Empty on a machine where nothing allocated a GPU (a plain CPU run). The workflow
    also passes ``--device cuda`` to jobs that reserve a ``gpu`` resource."""
    env = os.environ if environ is None else environ
    found = {}
    for var in GPU_VARS:
        value = env.get(var, "").strip()
        first = value.split(",")[0].strip()
        if var == "SLURM_GPUS_ON_NODE":
            named = first.isdigit() and int(first) > 0
        else:
            named = first.isdigit() or first.upper().startswith(("GPU-", "MIG-"))
        if named:
            found[var] = value
    return found


def _show(variables: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in variables.items())


def _why_no_cuda() -> str:
    """Why ``torch.cuda.is_available()`` is false, in torch's words where it has them."""
    import torch  # here: commands that never train start without it
    if not torch.backends.cuda.is_built():
        return f"this torch ({torch.__version__}) is built without CUDA"
    try:
        torch.cuda.init()
    except Exception as exc:  # torch's own diagnosis (no driver, no visible device, ...)
        return f"torch {torch.__version__} cannot use CUDA: {exc}"
    return f"torch {torch.__version__} sees no CUDA device"


def nvml_free_memory(n: int) -> list[int] | None:
    """Free bytes of CUDA devices ``0..n-1`` as NVML reports them (NVML reads the driver:
    unlike ``torch.cuda.mem_get_info`` it opens no CUDA context on each card), matched to
    torch's indices by UUID, so ``CUDA_VISIBLE_DEVICES`` is respected. ``None`` where NVML
    cannot say: ``nvidia-ml-py`` not installed (``pip install "dpaudit[gpu]"``), no driver
    library, or a device NVML does not list (a MIG slice)."""
    import torch  # here: commands that never train start without it
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        handles = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            handles[_uuid_key(pynvml.nvmlDeviceGetUUID(handle))] = handle
        free = []
        for i in range(n):
            handle = handles.get(_uuid_key(getattr(torch.cuda.get_device_properties(i),
                                                   "uuid", "")))
            if handle is None:
                return None
            free.append(int(pynvml.nvmlDeviceGetMemoryInfo(handle).free))
        return free
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def _uuid_key(uuid: object) -> str:
    """A GPU UUID as both NVML (``GPU-`` prefix, str or bytes) and torch write it."""
    text = (uuid.decode() if isinstance(uuid, bytes) else str(uuid)).strip().lower()
    return text[4:] if text.startswith(("gpu-", "mig-")) else text


def describe(device: str | torch.device | None = None) -> dict:
    """What provenance records about the device used, ``resolve(device)`` (the same card
    for the rest of the process once claimed):
    ``device`` (``"cpu"``, ``"cuda:0"``), ``gpu_name`` (``"NVIDIA H100 80GB HBM3"``),
    ``capability`` (compute capability, ``"9.0"``) and ``sm_count`` (streaming
    multiprocessors: the BLAS picks its kernels by the card, which round products
    differently), all three ``None`` on the CPU; ``torch``
    (``torch.__version__``) and ``cuda`` (the CUDA version torch was built with, ``None``
    for a CPU-only build). A restore should match on :data:`REPRODUCE_KEYS`. Reads the
    card's properties from the driver: no context opens on any other card. While a GPU
    description is forced (:func:`forced`) the work ran on the CPU: ``device`` is
    ``"cpu"``, the GPU fields ``None``, and ``forced_gpu`` names the description."""
    import torch  # here: commands that never train start without it
    dev = resolve(device)
    info = {"device": str(dev), "gpu_name": None, "capability": None, "sm_count": None,
            "torch": torch.__version__, "cuda": torch.version.cuda or None}
    desc = forced()
    if desc is not None:
        info["forced_gpu"] = desc.name
    elif dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev.index)
        info.update(gpu_name=props.name,
                    capability=f"{props.major}.{props.minor}",
                    sm_count=props.multi_processor_count)
    return info


def reproduce_key(device: str | torch.device | None = None) -> dict:
    """The :data:`REPRODUCE_KEYS` of :func:`describe`: what a restore key records of the
    device, so that results trained on another kind of device are trained again; with
    ``forced_gpu`` while a description is forced, so that a dry run's results match
    neither a real CPU's key nor a real GPU's (and keys without forcing are unchanged)."""
    info = describe(device)
    return {k: info[k] for k in (*REPRODUCE_KEYS, "forced_gpu") if k in info}


@contextmanager
def deterministic(dev: str | torch.device) -> Iterator[None]:
    """Within this scope, CUDA work on ``dev`` is bitwise reproducible (same code, data,
    seed, GPU model and software): ``torch.use_deterministic_algorithms(True)`` (an op
    with no deterministic CUDA kernel raises instead of running), cuDNN's deterministic
    algorithms without benchmarking, and ``CUBLAS_WORKSPACE_CONFIG`` set to
    ``:4096:8`` unless it already holds a deterministic value. All are restored on exit.
    One thing cannot be: torch reads the cuBLAS workspace size once per process, at the
    first cuBLAS call, so enter this scope before any CUDA matmul (as the task's
    pretraining does) for the same workspace on every run. On the CPU (already
    deterministic) a no-op, unless a GPU description is forced (:func:`is_gpu`)."""
    import torch  # here: commands that never train start without it
    if not is_gpu(dev):
        yield
        return
    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
             os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    if saved[-1] not in CUBLAS_DETERMINISTIC:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_DETERMINISTIC[0]
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2:4]
        if saved[-1] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[-1]


def claim_first(names: Sequence[str], lock_dir: Path) -> tuple[str, IO | None]:
    """The first of ``names`` (GPUs) that no other process holds, claimed by an exclusive
    lock on ``lock_dir/<name>.lock`` that lasts while the returned file is open (the
    operating system releases it when the process ends, however it ends). When every one
    is held, or the locks cannot be made: the first, with no lock."""
    try:
        lock_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        return names[0], None
    for name in names:
        try:
            fh = open(lock_dir / f"{name}.lock", "w")
        except OSError:
            continue
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            continue
        return name, fh
    return names[0], None


__all__ = ["DEVICES", "LOCK_DIR", "GPU_VARS", "REPRODUCE_KEYS", "JOBS_PER_GPU_VAR",
           "FORCE_GPU_VAR", "GPU_FIELDS", "DeviceUnavailable", "GpuDescription", "forced",
           "forced_gpu", "is_gpu", "gpu_count", "memory_info", "resolve", "jobs_per_gpu",
           "given_gpus", "nvml_free_memory", "describe", "reproduce_key", "deterministic",
           "claim_first"]
