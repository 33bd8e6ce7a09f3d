"""One case of ``bench_distributed`` on one rank: a model built fresh, wrapped in DDP or
FSDP2, run in one mode (eager, ``torch.compile``, ``kiln.compile``), warmed up, checked
engaged, timed and profiled. Runs inside the ranks ``bench_distributed`` spawns.

Not a benchmark itself (``gpu.py`` runs only ``bench_*.py``).
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from comm_overlap import Overlap, overlap
from gpu_timing import device_events
from timing import background_builds_finished
from torch.autograd import DeviceType

MODELS = ("gpt2", "llama")
WRAPPERS = ("ddp", "fsdp")
MODES = ("eager", "torch.compile", "kiln")
DISTINCT_BATCHES = 4  # the steps cycle through these, the same in every mode
# SGD with momentum: a step's change follows the gradients, so the modes' losses stay within
# ~1e-4 of each other over the steps when their gradients agree, and a wrong gradient (one
# summed instead of averaged) moves them by several %; AdamW normalises the update (a scale
# error would not show) and makes the trajectory chaotic within 20 steps
OPTIMIZER = {"lr": 1e-3, "momentum": 0.9}
NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


@dataclass(frozen=True)
class Settings:
    """What the environment asks for (read once in the parent, passed to the ranks)."""

    device: str  # "cuda" or "cpu"
    tiny: bool
    models: tuple[str, ...]
    wrappers: tuple[str, ...]
    modes: tuple[str, ...]
    batch: int  # sequences per rank
    seq: int
    warmup: int
    steps: int  # timed
    profile_steps: int
    budget_s: float
    timeout_s: float
    ignored: tuple[str, ...] = field(default=())  # names the environment gave that match none

    @property
    def bf16(self) -> bool:
        return self.device == "cuda"

    def precision(self) -> str:
        if not self.bf16:
            return "float32 parameters and compute"
        return (
            "float32 parameters and optimizer; DDP: forward and loss under torch.autocast(bf16); "
            "FSDP2: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32)"
        )


# --- models -------------------------------------------------------------------------------


def gpt2(tiny: bool) -> torch.nn.Module:
    """GPT-2 small (12 layers, 768 wide: 124M parameters) with its LM head, no dropout."""
    from transformers import GPT2Config, GPT2LMHeadModel

    size = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 1024, "n_positions": 128,
            "bos_token_id": 0, "eos_token_id": 0}  # fmt: skip
    config = GPT2Config(**(size if tiny else {}), use_cache=False, **NO_DROPOUT)
    return GPT2LMHeadModel(config)


def llama(tiny: bool) -> torch.nn.Module:
    """A Llama with 8 layers, 1024 wide, grouped-query attention (16 heads, 8 for keys and
    values), a 32k vocabulary and an untied LM head: 160M parameters."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if tiny:
        size = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024,
                "max_position_embeddings": 128}  # fmt: skip
    else:
        size = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
                "num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 32000,
                "max_position_embeddings": 1024}  # fmt: skip
    return LlamaForCausalLM(LlamaConfig(**size, use_cache=False))


BUILDERS = {"gpt2": gpt2, "llama": llama}


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (FSDP2 shards each on its own)."""
    inner = getattr(model, "transformer", None) or model.model
    return list(getattr(inner, "h", None) or inner.layers)


def wrap(model: torch.nn.Module, wrapper: str, settings: Settings, rank: int) -> torch.nn.Module:
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[rank] if settings.device == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(settings.device, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if settings.bf16 else None,
        reduce_dtype=torch.float32 if settings.bf16 else None,
    )
    for block in blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def build_mode(model: torch.nn.Module, mode: str):
    if mode == "eager":
        return model
    if mode == "torch.compile":
        return torch.compile(model)
    import kiln

    return kiln.compile(model)


# --- the training step ----------------------------------------------------------------------


class Trainer:
    """The wrapped model, its optimizer, the batches of this rank, and one training step:
    forward with the LM loss (``labels=input_ids``), backward, ``SGD.step()``,
    ``zero_grad(set_to_none=True)``."""

    def __init__(self, name: str, wrapper: str, mode: str, settings: Settings, rank: int):
        self.device = torch.device(settings.device, rank if settings.device == "cuda" else 0)
        torch.manual_seed(0)  # the same weights on every rank, in every mode
        with torch.device(self.device):
            model = BUILDERS[name](settings.tiny)
        self.parameters = sum(p.numel() for p in model.parameters())
        self.model = wrap(model, wrapper, settings, rank)
        self.optimizer = torch.optim.SGD(self.model.parameters(), **OPTIMIZER)
        self.fn = build_mode(self.model, mode)
        self.autocast = wrapper == "ddp" and settings.bf16
        vocab = model.config.vocab_size
        data = torch.Generator().manual_seed(1000 + rank)  # each rank its own batches
        self.batches = [
            torch.randint(0, vocab, (settings.batch, settings.seq), generator=data).to(self.device)
            for _ in range(DISTINCT_BATCHES)
        ]
        self.done = 0

    def step(self) -> torch.Tensor:
        ids = self.batches[self.done % DISTINCT_BATCHES]
        self.done += 1
        cast = (
            torch.autocast(self.device.type, dtype=torch.bfloat16)
            if self.autocast
            else contextlib.nullcontext()
        )
        with cast:
            loss = self.fn(input_ids=ids, labels=ids).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


# --- is the mode engaged? -------------------------------------------------------------------


def dynamo_counts() -> tuple[int, int]:
    """(graphs torch.compile captured, graph breaks) in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), sum(counters["graph_break"].values())


def kiln_compiled_seconds() -> float:
    """Seconds kiln spent turning graphs into code (every stage but capture), or reading
    them from its cache, since ``kiln.reset()``: zero means no graph was compiled."""
    import kiln

    return sum(s for stage, s in kiln.compile_times().items() if stage != "capture")


def before_mode(mode: str):
    """Forget earlier compiles, so the case compiles (and is counted) on its own."""
    torch._dynamo.reset()
    if mode == "kiln":
        import kiln

        kiln.reset()
    return dynamo_counts()


def engaged(mode: str, dynamo_before: tuple[int, int], caught: list[str]) -> tuple[bool, str]:
    """(the mode ran compiled code, a note), after the warm-up steps."""
    if mode == "torch.compile":
        graphs, breaks = (a - b for a, b in zip(dynamo_counts(), dynamo_before, strict=True))
        if graphs <= 0:
            return False, "not engaged: torch.compile captured no graph"
        return True, f"{graphs} graph(s), {breaks} graph break(s)"
    if mode == "kiln":
        eager = [w for w in caught if "eagerly" in w]
        seconds = kiln_compiled_seconds()
        if seconds <= 0:
            return False, "not engaged: kiln compiled no graph" + (
                f" ({len(eager)} 'runs eagerly' warning(s))" if eager else ""
            )
        note = f"compiled ({seconds:.1f} s in kiln's stages)"
        if eager:
            note += f"; partly eager: {len(eager)} 'runs eagerly' warning(s)"
        return True, note
    return True, ""


# --- one case -------------------------------------------------------------------------------


def profile_steps(trainer: Trainer, steps: int) -> tuple[float, Overlap | None]:
    """Run ``1 + steps`` steps under ``torch.profiler`` on every rank (each is slowed alike;
    device activity only, on a GPU): the first starts the profiler's tracing, the others are
    recorded. Seconds per recorded step, and the overlap of their device kernels."""
    from torch.profiler import ProfilerActivity, profile, schedule

    on_gpu = trainer.device.type == "cuda"
    activities = [ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU]
    trainer.sync()
    background_builds_finished()
    dist.barrier()  # the ranks start together: a kernel waiting for the other rank counts
    with profile(
        activities=activities, schedule=schedule(wait=0, warmup=1, active=steps), acc_events=True
    ) as prof:
        for i in range(1 + steps):
            if i == 1:
                start = time.perf_counter()
            trainer.step()
            trainer.sync()
            if i == steps:
                seconds = (time.perf_counter() - start) / steps
            prof.step()  # after the last step: the trace is processed
    if not on_gpu:
        return seconds, None  # gloo's work has no device kernels to read
    return seconds, overlap(device_events(prof.events(), DeviceType.CUDA), steps)


def timed_steps(trainer: Trainer, steps: int) -> tuple[list[float], list[torch.Tensor]]:
    """Seconds of each of ``steps`` steps (each ends with a device synchronisation), and
    their losses (read afterwards, so that the loop does not wait for them)."""
    times, losses = [], []
    background_builds_finished()
    trainer.sync()
    for _ in range(steps):
        start = time.perf_counter()
        losses.append(trainer.step())
        trainer.sync()
        times.append(time.perf_counter() - start)
    return times, losses


def run_case(
    name: str, wrapper: str, mode: str, settings: Settings, rank: int, say
) -> tuple[dict[str, object], Trainer | None]:
    """Every timed figure of one (model, wrapper, mode) on this rank, as a JSON-ready dict,
    and its trainer where the mode is engaged (for :func:`profile_case`, which must run
    after every mode is timed); raises where the mode cannot run."""
    row: dict[str, object] = {"model": name, "wrapper": wrapper, "mode": mode}
    dynamo_before = before_mode(mode)
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = Trainer(name, wrapper, mode, settings, rank)
        row["parameters"] = trainer.parameters
        losses = [trainer.step().item() for _ in range(settings.warmup)]
        trainer.sync()
        ok, row["note"] = engaged(mode, dynamo_before, unique_warnings(caught))
        row["ready_s"] = time.perf_counter() - started
        say(f"ready in {row['ready_s']:.1f} s; {row['note'] or 'eager'}")
        if ok:
            times, timed = timed_steps(trainer, settings.steps)
            row["step_ms"] = statistics.median(times) * 1e3
            row["mean_ms"] = statistics.fmean(times) * 1e3
            losses += [t.item() for t in timed]
            say(
                f"{row['step_ms']:.2f} ms/step (median of {settings.steps}, mean "
                f"{row['mean_ms']:.2f}); loss {losses[0]:.4f} at the first step, "
                f"{losses[-1]:.4f} at the last"
            )
        row["losses"] = losses
        row["warnings"] = unique_warnings(caught)
    return row, (trainer if ok else None)


def profile_case(row: dict[str, object], trainer: Trainer, settings: Settings) -> None:
    """The profiled figures of a timed case, into its ``row``. Every rank profiles the same
    cases, after all the modes of a (model, wrapper) are timed: once ``torch.profiler`` has
    traced CUDA activity, CUPTI stays attached to the process and slows every later CUDA
    call (``gpu_timing.profile_calls``)."""
    if settings.profile_steps <= 0:
        return
    seconds, found = profile_steps(trainer, settings.profile_steps)
    row["profiled_ms"] = seconds * 1e3
    if found is not None:
        row["profile"] = {
            "compute_ms": found.compute_us / 1e3,
            "comm_ms": found.comm_us / 1e3,
            "exposed_ms": found.exposed_us / 1e3,
            "hidden": found.hidden_share,
        }


NOT_REPORTED = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)  # API notices


def unique_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """Each warning once (category and message), API deprecation notices left out."""
    seen: dict[str, None] = {}
    for w in caught:
        if issubclass(w.category, NOT_REPORTED):
            continue
        seen.setdefault(f"{w.category.__name__}: {str(w.message).strip()[:300]}", None)
    return list(seen)


def release(settings: Settings) -> None:
    torch._dynamo.reset()
    gc.collect()
    if settings.device == "cuda":
        torch.cuda.empty_cache()


def environment() -> list[str]:
    import transformers

    lines = [f"torch {torch.__version__}", f"transformers {transformers.__version__}"]
    if torch.cuda.is_available():
        lines.append(f"device {torch.cuda.get_device_name()}")
    with contextlib.suppress(ImportError):
        import triton

        lines.append(f"triton {triton.__version__}")
    return lines
