"""The full stack for one captured graph: autograd → loop IR → code generator → runtime.

:func:`aot_backend` makes the backend (``torch.compile``'s contract) for one frame: it
hands the captured graph to kiln-autograd with an :class:`AtenCompiler` for the forward
(and inference) graphs and one for the backward graph. ``AtenCompiler.__call__`` is the
pipeline for one aten graph, top to bottom:

1. write the aten graph to the log and the debug folder;
2. pick the code generator for the graph's device;
3. rewrite it (``AtenCompiler.rewrite``): on CUDA, pad 16-bit matrix products whose
   rows are not 16-byte aligned where that is faster (:mod:`kiln.padding`), give a tanh
   GELU after a product to the product's epilogue (:mod:`kiln.epilogues`), let attention
   read grouped keys and values before their repeat (:mod:`kiln.grouped_attention`) and
   compute convolutions whose kernel tiles the image as matrix products where faster
   (:mod:`kiln.patch_convolutions`); freeze an inference graph, splitting off what its
   parameters and buffers alone compute, computed once (:mod:`kiln.freezing`: batch
   norms folded, weights laid out; on CUDA, products of one input by several weights
   merged into one where faster, :mod:`kiln.sibling_products`); on CUDA, compute a
   forward graph's depthwise convolutions as sums of shifted products, which fuse into
   one generated kernel (:mod:`kiln.depthwise_convolutions`), and with
   ``mode="max-autotune"`` give a ReLU after a convolution (and a residual) to cuDNN's
   fused convolution where that costs no time (:mod:`kiln.convolution_epilogues`), and
   always the other convolution biases to the kernel after the convolution
   (:mod:`kiln.folding`). What "faster" is was timed on the device once per shape and
   machine, and is kept in the cache (:mod:`kiln.device_timing`). A warm start reads
   what the rewrites made instead (:mod:`kiln.rewrite_records`);
4. load the graph from the on-disk cache, or lower, schedule and generate it
   (kiln-loopir's ``compile_fx`` with the code generator) and store it there; a graph
   kiln-autograd rebuilt from its record (a warm start, :mod:`kiln.signature_records`) is
   only loaded: one not in the cache raises ``kiln_autograd.NeedsTrace``, and is traced;
5. write the loop IR, the kernels and the host program to the log and the debug folder;
6. wrap it for the mode (``reduce-overhead``: the ``kiln.runtime`` plug-in), and a frozen
   graph in what feeds it its state's values.

A failure costs one graph, never the frame: a graph that kiln-autograd cannot trace runs
as captured (torch ops, eager autograd), and an aten graph that cannot be lowered or whose
code generation fails (no compiler, a compile error, a kernel the generator cannot render)
runs eagerly. Each says so in one warning line naming the graph and the reason; the
traceback goes to the ``fallbacks`` log. With ``options={"fallback": False}`` it raises.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.fx

import kiln_autograd
import kiln_loopir
from kiln import (
    attention,
    convolution_epilogues,
    depthwise_convolutions,
    device_timing,
    epilogues,
    folding,
    freezing,
    grouped_attention,
    layouts,
    logs,
    padding,
    patch_convolutions,
    runtime,
    sibling_products,
)
from kiln.backward_ahead import Ahead
from kiln.cache import Entry, GraphCache, graph_key, load_entry
from kiln.cache_folders import usable_root
from kiln.config import Config, cache_root
from kiln.constants import lift_constants
from kiln.frames import Frame, calling_a_module_in_training, waiting_for_other_threads
from kiln.freezing import FrozenGraph, WithFrozenState
from kiln.rewrite_records import RewriteRecords, Rewritten, rewrite_key
from kiln.signature_records import SignatureRecords
from kiln_capture.user_frames import warn_user
from kiln_loopir import HostProgram, compile_lock
from kiln_loopir.compile import graph_device

cache_log = logging.getLogger("kiln.cache")
REWRITES = "kiln_rewrites"  # on a rewritten captured graph: which rewrites, for the log
KERNEL_SUFFIX = {"cpp": ".cpp", "triton": ".py", "reference": ".py"}


class CodegenFailed(RuntimeError):
    """The code generator could not make a graph's kernels; the graph runs eagerly."""


class NoCodegen(RuntimeError):
    """No code generator serves the graph's device as configured: a setup error, raised."""


class ObservedCodegen:
    """A code generator seen through the frame: its stages are timed and reported, and
    whatever it raises becomes :class:`CodegenFailed`."""

    def __init__(self, inner: object, frame: Frame, kind: str) -> None:
        self.inner = inner
        self.name = inner.name
        self.device_types = inner.device_types
        self.renders_scans = getattr(inner, "renders_scans", False)
        self.merges_reduction_loops = getattr(inner, "merges_reduction_loops", False)
        self.vectorises_masked_strided_reads = getattr(
            inner, "vectorises_masked_strided_reads", True
        )
        self.frame = frame
        self.kind = kind
        if hasattr(inner, "render_group"):  # it chains kernels: one call per launch group
            self.render_group = lambda group: self._rendered(inner.render_group, group)
        if hasattr(inner, "render_host"):  # it builds host programs natively
            self.render_host = inner.render_host
            self.load_host = inner.load_host
        if hasattr(inner, "build_host"):  # natively, once its kernels are built
            self.build_host = lambda *args: self._host(inner.build_host, *args)
            self.rebuild_host = lambda *args: self._host(inner.rebuild_host, *args)
        if hasattr(inner, "prepare_host"):  # work for it begun before the kernels render
            self.prepare_host = lambda *args: self._host(inner.prepare_host, *args)
        if hasattr(inner, "begin_compile"):  # work for the build, begun as lowering starts
            self.begin_compile = inner.begin_compile

    def render(self, kernel) -> str:
        return self._rendered(self.inner.render, kernel)

    def _host(self, build: Callable, *args):
        """A native host program built after the kernels (planning each launch, timing
        the launch configurations of big kernels): the ``host`` stage."""
        with self.frame.stage("host", f"{self.kind}: planning launches, native host program"):
            return build(*args)

    def _rendered(self, render: Callable, item) -> str:
        with self.frame.stage("render"):
            try:
                return render(item)
            except Exception as exc:
                raise CodegenFailed(
                    f"{self.name} could not render {item.name}: {type(exc).__name__}: {exc}"
                ) from exc

    def compile(
        self, sources: Sequence[str], host: object = None, cached: bool = False
    ) -> list[Callable]:
        """The code generator's callables for ``sources``; ``cached``: the graph came from
        the cache (the kernels are loaded: built again only where a cache lost them)."""
        verb = "loading" if cached else "building"
        what = f"{self.kind}: {verb} {_count(len(sources), 'kernel')} with {self.name}"
        if host is not None:
            what += " and the native host program"
        with self.frame.stage("build", what):
            try:
                if host is not None:
                    return self.inner.compile(sources, host=host)
                return self.inner.compile(sources)
            except Exception as exc:
                raise CodegenFailed(
                    f"{self.name} could not build the kernels: {type(exc).__name__}: {exc}"
                ) from exc


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _warn_eager(frame: Frame, kind: str, reason: str) -> None:
    frame.ran_eagerly = True  # no signature record then: its graphs have no cache entries
    warn_user(
        f"kiln: {frame.describe()} {kind} graph runs eagerly (ATen kernels, no generated "
        f"code): {reason}"
    )


def _internal_error(frame: Frame, kind: str, stage: str, exc: Exception) -> None:
    """One warning line for an error of ``stage`` on one graph; the traceback is logged."""
    first_line = (str(exc).strip().splitlines() or [""])[0]
    logs.logger("fallbacks").info(
        "%s %s graph: %s failed", frame.describe(), kind, stage, exc_info=exc
    )
    _warn_eager(
        frame,
        kind,
        f"{stage} failed: {type(exc).__name__}: {first_line}. The rest of the function is "
        "compiled; to avoid this, run that op outside the compiled function (and please "
        "report it, with KILN_LOGS=fallbacks for the traceback)",
    )


def _cache_key(gm, example_inputs, codegen, settings) -> str | None:
    try:
        return graph_key(gm, example_inputs, codegen, settings)
    except Exception:  # a graph the key cannot describe is compiled, just not cached
        cache_log.warning(
            "cannot compute the cache key of a graph; it is not cached", exc_info=True
        )
        return None


def entry_point(program: HostProgram, constants: Sequence[torch.Tensor]) -> Callable:
    """What runs a graph at each call: its host program's ``call``, with nothing in
    between, the constants bound as its last inputs. The layouts of its inputs are pinned
    before it runs: a forward graph's inputs are the captured graph's, which capture's
    guards pin (sizes, strides, dtypes); a backward graph's are what the forward saved, as
    the forward's host program laid them out, and the incoming gradients, which autograd
    gives in the outputs' sizes and dtypes and kiln-autograd makes contiguous, as traced."""
    return program.with_last_inputs(constants)


def _steps(entry: Entry) -> int:
    """The kernels and extern calls of a compiled graph: the unindented lines of its
    printed schedule but its inputs and its ``return``."""
    return sum(
        1
        for line in entry.schedule.splitlines()
        if line and not line[0].isspace() and not line.startswith(("input ", "return "))
    )


def _kernels_text(kernels: Sequence[tuple[str, str]]) -> str:
    return "\n\n".join(source.rstrip() for _, source in kernels)


class AtenCompiler:
    """``compiler(gm, example_inputs)`` for kiln-autograd: one kind of aten graph of one
    frame (``forward`` for forward and inference graphs, ``backward``)."""

    def __init__(self, config: Config, frame: Frame, kind: str, generate: bool) -> None:
        self.config = config
        self.options = config.options
        self.frame = frame
        self.kind = kind
        self.generate = generate  # False: aot_eager, the aten graph runs as it is

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[object]):
        with compile_lock.compiling():  # a backward compiled ahead takes turns with others
            return self._compile(gm, example_inputs)

    def _compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[object]):
        frame, kind = self.frame, self.kind
        self.show_aten_graph(gm)  # 1
        if not self.generate:
            return gm.forward
        # read before compiling: the code generator may rewrite the graph in place
        unused_inputs = kiln_autograd.unused_seed_inputs(gm)
        device = graph_device(gm, example_inputs)
        codegen = self.pick_codegen(device)  # 2
        if codegen is None:
            return gm.forward
        root = usable_root(cache_root(self.options))  # None: refused, with a warning
        made = self.rewritten(gm, example_inputs, device, codegen, root)  # 3
        gm, example_inputs, frozen = made.graph, made.example_inputs, made.frozen
        try:
            program, constants, entry = self.compile_or_load(gm, example_inputs, codegen, root)  # 4
        except kiln_autograd.NeedsTrace:
            raise
        except CodegenFailed as exc:
            if not self.options.fallback:
                raise
            _warn_eager(frame, kind, str(exc))
            return gm.forward
        except Exception as exc:  # an internal error: this aten graph runs eagerly
            if not self.options.fallback:
                raise
            _internal_error(frame, kind, "lowering and scheduling (kiln-loopir)", exc)
            return gm.forward
        self.show_generated(entry, codegen)  # 5
        compiled = entry_point(program, constants)
        with frame.stage("runtime"):
            compiled = runtime.wrap_for_mode(  # 6
                compiled,
                example_inputs,
                self.options,
                device,
                static_inputs=kiln_autograd.static_inputs(gm) or (),
                unchecked_outputs=kiln_autograd.rng_state_outputs(gm),
                unused_inputs=unused_inputs,
                steps=_steps(entry),
                saved_outputs=kiln_autograd.saved_outputs(gm),
            )
        if frozen is not None:
            compiled = WithFrozenState(compiled, frozen)
        if kind == "backward":  # compiled ahead, or at the first backward
            frame.log_perf("backward compiled")
        return compiled

    # --- the steps ------------------------------------------------------------------

    def show_aten_graph(self, gm: torch.fx.GraphModule) -> None:
        if self.frame.folder is None and not logs.enabled("graph"):
            return  # printing a graph costs as much as restoring it from a record
        code = gm.print_readable(print_output=False)
        logs.logger("graph").info("%s %s aten graph:\n%s", self.frame.describe(), self.kind, code)
        self.frame.dump(self.frame.file_name(f"{self.kind}_aten.py"), code)

    def rewritten(self, gm, example_inputs, device: torch.device, codegen, root) -> Rewritten:
        """The graph rewritten (:meth:`rewrite`), or read from the record that a compile of
        the same graph kept under the cache ``root``, where the graph cache holds what it
        leads to (a warm start: :mod:`kiln.rewrite_records`)."""
        root = root if self.options.cache else None  # None: nothing kept on disk
        settings = self.options.code_settings()
        key = None
        if root is not None:
            rewrites = {**settings, "freezing": self.options.freezing}
            key = rewrite_key(gm, example_inputs, codegen, rewrites, self.kind, device)
        records = RewriteRecords(root) if key is not None else None
        if key is not None:
            with self.frame.stage("cache_load"):
                found = records.load(key, gm, example_inputs)
                kept = found is not None and self.in_graph_cache(root, found, codegen, settings)
            if kept:
                self.show_rewritten(gm, found)
                return found
            if found is not None and kiln_autograd.is_restored(gm):  # lowering needs a trace
                raise kiln_autograd.NeedsTrace(f"{self.kind} graph not in the graph cache")
        # the timed decisions are kept on disk under the root, as the records are
        with self.frame.stage("rewrite"), device_timing.decisions_in(root):
            made = Rewritten(*self.rewrite(gm, example_inputs, device))
        self.show_rewritten(gm, made)
        if records is not None:
            with self.frame.stage("cache_load"):
                records.store(key, gm, example_inputs, made)
        return made

    def in_graph_cache(self, root: Path, made: Rewritten, codegen, settings) -> bool:
        """Whether the graph cache holds the compiled form of a rewritten graph."""
        key = _cache_key(made.graph, made.example_inputs, codegen, settings)
        return key is not None and GraphCache(root).path(key).exists()

    def show_rewritten(self, original: torch.fx.GraphModule, made: Rewritten) -> None:
        """Log and dump what the rewrites changed (the frozen graphs, the rewritten one)."""
        if self.frame.folder is None and not logs.enabled("graph"):
            return  # printing the graphs costs more than rewriting them
        if made.frozen is not None:
            self.show_frozen(made.frozen)
        if made.graph is not original:
            code = made.graph.print_readable(print_output=False)
            logs.logger("graph").info(
                "%s %s graph, rewritten:\n%s", self.frame.describe(), self.kind, code
            )
            self.frame.dump(self.frame.file_name(f"{self.kind}_aten_rewritten.py"), code)

    def rewrite(self, gm: torch.fx.GraphModule, example_inputs, device: torch.device):
        """``(graph, example inputs, frozen graph or None)``: on CUDA, badly aligned
        products padded where faster, tanh GELUs given to the products before them and
        attention over repeated keys and values given them before the repeat and
        convolutions whose kernel tiles the image computed as products where faster; an
        inference graph frozen (on CUDA, with its products of one input by several frozen
        weights merged where faster: kept only where the graph is frozen); on CUDA, a
        forward graph's depthwise convolutions as sums of shifted products, and with
        ``max_autotune``, ReLUs after convolutions (and residuals) applied by cuDNN's fused
        convolution where that costs no time; the other convolution biases added by the
        kernel after the convolution. A rewrite that fails is skipped (logged on
        ``kiln.fallbacks``). A graph these changed is dumped as
        ``<kind>_aten_rewritten.py``."""
        if device.type == "cuda":
            gm = self.optional("padding products", padding.padded_products, gm) or gm
            gm = self.optional("GELU epilogues", epilogues.gelu_epilogues, gm) or gm
            grouped = grouped_attention.grouped_query_attention
            gm = self.optional("grouped attention", grouped, gm) or gm
            patches = patch_convolutions.patch_convolutions
            gm = self.optional("convolutions as products", patches, gm) or gm
        frozen = None
        if self.options.freezing:
            merged = None
            if device.type == "cuda":
                merged = self.optional("merging products", sibling_products.merged_products, gm)
            frozen = self.optional("freezing", freezing.freeze, merged or gm, example_inputs)
            if frozen is None and merged is not None:  # unfrozen, the merged weights cost
                frozen = self.optional("freezing", freezing.freeze, gm, example_inputs)
        if frozen is not None:
            gm, example_inputs = frozen.graph, frozen.example_inputs
        if device.type == "cuda" and self.kind == "forward":
            sums = depthwise_convolutions.depthwise_as_sums
            gm = self.optional("depthwise convolutions as sums", sums, gm) or gm
            if self.options.max_autotune:  # cuDNN's fused forms cost seconds each to time
                relus = convolution_epilogues.relu_epilogues
                gm = self.optional("ReLU epilogues of convolutions", relus, gm) or gm
            gm = self.optional("moving biases", folding.biases_after_convolutions, gm) or gm
        return gm, example_inputs, frozen

    def optional(self, what: str, rewrite: Callable, *args):
        """``rewrite(*args)``, or None where it raises (logged: the graph is compiled
        without it; with ``options={"fallback": False}`` it raises)."""
        try:
            return rewrite(*args)
        except Exception as exc:  # noqa: BLE001 - the graph is compiled without it
            if not self.options.fallback:
                raise
            logs.logger("fallbacks").info(
                "%s %s graph: %s failed; compiled without it",
                self.frame.describe(), self.kind, what, exc_info=exc,
            )  # fmt: skip
            return None

    def show_frozen(self, frozen: FrozenGraph) -> None:
        if self.frame.folder is None and not logs.enabled("graph"):
            return  # printing both graphs costs more than freezing them
        source = frozen.source()
        logs.logger("graph").info(
            "%s %s graph, frozen (%d batch norms folded, %d weights laid out):\n%s",
            self.frame.describe(), self.kind, frozen.folded_batch_norms,
            frozen.laid_out_weights, source,
        )  # fmt: skip
        self.frame.dump(self.frame.file_name(f"{self.kind}_frozen.py"), source)

    def pick_codegen(self, device: torch.device) -> object | None:
        """The code generator for ``device``; with ``backend="auto"`` and none installed,
        None (the graph runs eagerly, with a warning)."""
        try:
            return kiln_loopir.resolve_codegen(self.options.codegen, device.type)
        except (RuntimeError, ValueError) as exc:
            if self.config.backend != "auto" or self.options.codegen is not None:
                raise NoCodegen(str(exc)) from exc
            _warn_eager(self.frame, self.kind, str(exc))
            return None

    def compile_or_load(
        self, gm, example_inputs, codegen, root: Path | None
    ) -> tuple[HostProgram, list[torch.Tensor], Entry]:
        settings = self.options.code_settings()
        observed = ObservedCodegen(codegen, self.frame, self.kind)
        cache = GraphCache(root) if self.options.cache and root is not None else None
        # the code generator's libraries and kernels under the same root (None: not cached)
        codegen_root = getattr(codegen, "cache_root", None)
        with codegen_root(root) if codegen_root else contextlib.nullcontext():
            return self.load_or_lower(gm, example_inputs, observed, settings, cache, codegen)

    def load_or_lower(self, gm, example_inputs, observed, settings, cache, codegen):
        key = _cache_key(gm, example_inputs, codegen, settings) if cache else None
        if key is None:
            cache = None
        restored = kiln_autograd.is_restored(gm)
        if restored and cache is None:
            raise kiln_autograd.NeedsTrace("the graph cache is off")
        lifted, lifted_inputs, constants = lift_constants(gm, example_inputs)
        if cache is not None:
            with self.frame.stage("cache_load", f"{self.kind}: looking in the graph cache"):
                entry = cache.load(key)
                if entry is not None:
                    # a native host program is built with the kernels (load_host), or
                    # after them, from them (rebuild_host)
                    load = getattr(observed, "load_host", None)
                    native = self.cached_native_host(entry, load, "failed", logging.WARNING)
                    fns = observed.compile(entry.kernel_sources, host=native, cached=True)
                    rebuild = getattr(observed, "rebuild_host", None)
                    if native is not None:
                        native.program = fns.pop()
                    elif rebuild is not None:
                        kernels = dict(zip(entry.kernel_names, fns, strict=True))
                        native = self.cached_native_host(
                            entry, lambda data: rebuild(data, kernels), "is stale", logging.INFO
                        )
                    return load_entry(entry, fns, native), constants, entry
        if restored:  # rebuilt from kiln-autograd's record: lowering needs the traced graph
            raise kiln_autograd.NeedsTrace(f"{self.kind} graph not in the graph cache")
        with self.frame.stage("loopir", f"{self.kind}: lowering and scheduling"):
            compiled = kiln_loopir.compile_fx(
                lifted,
                lifted_inputs,
                codegen=observed,
                fusion=self.options.fusion,
                reuse_memory=self.options.reuse_memory,
                host_program=self.options.host_program,
                stage=self.frame.stage,
            )
        launchers = [*compiled.kernels, *compiled.launch_groups]
        entry = Entry(
            kernel_names=[k.name for k in launchers],
            kernel_sources=[k.source for k in launchers],
            host_source=compiled.host_source,
            constants={c.name: c.value for c in compiled.graph.constants},
            num_inputs=len(compiled.graph.inputs),
            loop_ir=str(compiled.graph),
            schedule=str(compiled.schedule),
            native_host=compiled.native_host.to_dict() if compiled.native_host else None,
        )
        if cache is not None:
            cache.store(key, entry)
        return compiled.program, constants, entry

    def cached_native_host(self, entry: Entry, make, failure: str, level: int):
        """The native host program of a cache entry (``make(data)``), or None where the
        Python one runs: by choice, for a codegen with none (``make`` is None), or because it
        cannot be made (logged at ``level``; an error with ``host_program="native"``)."""
        if entry.native_host is None or self.options.host_program == "python" or make is None:
            return None
        try:
            return make(entry.native_host)
        except Exception as exc:  # noqa: BLE001 - the Python host program runs the graph
            if self.options.host_program == "native":
                raise CodegenFailed(f"no native host program: {exc}") from exc
            cache_log.log(
                level, "host program: Python, the cached native one %s (%s)", failure, exc
            )
            return None

    def show_generated(self, entry: Entry, codegen: object) -> None:
        frame, kind = self.frame, self.kind
        kernels = list(zip(entry.kernel_names, entry.kernel_sources, strict=True))
        name = getattr(codegen, "name", "kernels")
        suffix = KERNEL_SUFFIX.get(name, ".txt")
        logs.logger("schedule").info(
            "%s %s loop IR:\n%s\n%s %s after fusion:\n%s",
            frame.describe(),
            kind,
            entry.loop_ir,
            frame.describe(),
            kind,
            entry.schedule,
        )
        logs.logger("output_code").info(
            "%s %s kernels (%s):\n%s\n%s %s host program:\n%s",
            frame.describe(),
            kind,
            name,
            _kernels_text(kernels),
            frame.describe(),
            kind,
            entry.host_source,
        )
        frame.dump(frame.file_name(f"{kind}_loopir.txt"), entry.loop_ir)
        frame.dump(frame.file_name(f"{kind}_loopir_fused.txt"), entry.schedule)
        frame.dump(frame.file_name(f"{kind}_kernels{suffix}"), _kernels_text(kernels) or "")
        frame.dump(frame.file_name(f"{kind}_host.py"), entry.host_source)
        if entry.native_host is not None:  # what runs: the host program as C++
            frame.dump(frame.file_name(f"{kind}_host.cpp"), entry.native_host["source"])


def _backward_ahead(options) -> bool:
    """Whether a training graph's backward compiles while its forward does (option
    ``backward_ahead``; None: where a module in training mode is being called)."""
    if options.backward_ahead is None:
        return calling_a_module_in_training()
    return options.backward_ahead


def signature_records(config: Config, frame: Frame) -> SignatureRecords | None:
    """kiln-autograd's record cache under the cache root, where the on-disk cache is on."""
    if not config.options.cache:
        return None
    root = usable_root(cache_root(config.options))  # None: refused, with a warning
    return SignatureRecords(root, config, frame) if root is not None else None


def aot_backend(config: Config, frame: Frame, generate: bool):
    """The backend for one captured graph: kiln-autograd with Kiln's aten compilers.

    Its caller guards every call's inputs (kiln-capture, or TorchDynamo for
    ``backend="kiln"``), so what it returns is kiln-autograd's guarded entry point: the
    forward's host program itself where autograd has nothing to add."""

    def trace(gm: torch.fx.GraphModule, example_inputs: list[object], captured):
        """kiln-autograd's compile of ``gm`` (the ``captured`` graph, or a rewrite of it);
        the token that restores it in a later process goes on the captured graph's meta
        (:mod:`kiln.capture_store`)."""
        ahead = Ahead(frame.waiting) if generate and _backward_ahead(config.options) else None
        try:
            with compile_lock.compiling(), frame.stage("autograd"):
                compiled = kiln_autograd.aot(
                    gm,
                    example_inputs,
                    fw_compiler=AtenCompiler(config, frame, "forward", generate),
                    bw_compiler=AtenCompiler(config, frame, "backward", generate),
                    partitioner=config.options.partitioner,
                    cache=signature_records(config, frame),
                    direct_gradients=config.options.direct_gradients,
                    backward_ahead=ahead,
                )
                if generate:
                    captured.meta["restore_token"] = compiled.restore_token()
                return compiled.guarded()
        finally:
            if ahead is not None:  # the backward's compile, started ahead, ends here
                with waiting_for_other_threads():
                    ahead.close()

    def backend(gm: torch.fx.GraphModule, example_inputs: list[object]):
        for rewritten in rewrites(gm, example_inputs):  # the captured graph rewritten
            if frame.folder is not None:
                code = rewritten.print_readable(print_output=False)
                frame.dump(frame.file_name("captured_rewritten.py"), code)
            try:
                return trace(rewritten, example_inputs, gm)
            except NoCodegen:
                raise
            except Exception as exc:  # e.g. a view that channels-last strides do not allow
                logs.logger("fallbacks").info(
                    "%s: tracing the rewritten graph (%s) failed; tried with fewer rewrites",
                    frame.describe(), rewritten.meta.get(REWRITES), exc_info=exc,
                )  # fmt: skip
        try:
            return trace(gm, example_inputs, gm)
        except NoCodegen:
            raise
        except Exception as exc:  # this graph runs as captured; the frame stays compiled
            if not config.options.fallback:
                raise
            _internal_error(frame, "captured", "tracing to aten (kiln-autograd)", exc)
            return gm.forward

    def rewrites(gm: torch.fx.GraphModule, example_inputs: list[object]):
        """The captured graph with hand-written attention fused, then also with
        channels-last convolution inputs, most rewritten first (each where it applies)."""
        options, found = config.options, []
        fused = None
        if options.fused_attention is not False:
            fused = attention.fused_attention(gm, on_cpu=bool(options.fused_attention))
            if fused is not None:
                fused.meta[REWRITES] = "fused attention"
                found.append(fused)
        wanted, on_cpu = layouts.wanted(options.channels_last, example_inputs)
        laid_out = layouts.channels_last(fused or gm, on_cpu=on_cpu) if wanted else None
        if laid_out is not None:
            laid_out.meta[REWRITES] = "channels-last" + (", fused attention" if fused else "")
            found.insert(0, laid_out)
        return found

    return backend
