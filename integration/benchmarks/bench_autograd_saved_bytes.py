"""Bytes saved for backward: kiln-autograd's min-cut partitioner against torch's.

Each case is a module (functions, layers, Hugging Face models built from tiny configs with
random weights) traced to the same core aten op set by both stacks. The bytes are what
``torch.autograd.graph.saved_tensors_hooks`` sees packed during one forward call: the sum
of the distinct storages saved for backward. Torch's side is
``aot_module_simplified(..., partition_fn=min_cut_rematerialization_partition)``.

A case that a stack cannot compile still gets its row, saying why in place of the bytes
(kiln-autograd's :class:`~kiln_autograd.UnsupportedError`; any error of torch's). OPT is
one on transformers versions whose decoder reads tensor contents in training: it builds an
all-ones attention mask and asks whether every element is set, to skip the causal mask for
SDPA, and draws ``torch.rand([]) < layerdrop`` for LayerDrop; both are ``.item()`` calls.

Run it with ``python3 -m nox -s bench -- saved_bytes`` (or ``python3
integration/bench.py saved_bytes``); ``main()`` returns the markdown table.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Callable

import torch
import torch.fx
import torch.nn.functional as F

import kiln_autograd


def saved_bytes(fn: Callable, inputs: list) -> int:
    """Bytes of the distinct storages packed for backward while ``fn(*inputs)`` runs."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(storages.values())


def kiln_saved_bytes(module: torch.nn.Module, inputs: list, partitioner: str) -> int:
    compiled = kiln_autograd.aot(module, inputs, lambda gm, _: gm, partitioner=partitioner)
    torch.manual_seed(0)
    return saved_bytes(compiled, inputs)


def torch_saved_bytes(module: torch.nn.Module, inputs: list) -> int:
    from torch._decomp import core_aten_decompositions
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.compilers import make_boxed_compiler
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    nop = make_boxed_compiler(lambda gm, _: gm)
    compiled = aot_module_simplified(
        module,
        inputs,
        fw_compiler=nop,
        bw_compiler=nop,
        partition_fn=min_cut_rematerialization_partition,
        decompositions=core_aten_decompositions(),
    )
    torch.manual_seed(0)
    return saved_bytes(lambda *a: compiled(*a), inputs)


def traced(fn: Callable) -> torch.fx.GraphModule:
    if isinstance(fn, torch.nn.Module):
        fn = AsTuple(fn)
    return torch.fx.symbolic_trace(fn)


class AsTuple(torch.nn.Module):
    """A module whose one output becomes a 1-tuple (the capture contract)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.inner(x),)


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, requires_grad=True)


class TupleOutput(torch.nn.Module):
    """A Hugging Face model as a flat-tuple graph: (loss, logits)."""

    def __init__(self, model: torch.nn.Module, input_name: str) -> None:
        super().__init__()
        self.model = model
        self.input_name = input_name

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(**{self.input_name: inputs}, labels=labels)
        return (out.loss, out.logits)


def hf_case(config_cls: str, model_cls: str, image: bool = False, **config: object) -> Callable:
    def build() -> tuple[torch.nn.Module, list]:
        import transformers

        torch.manual_seed(0)
        cfg = getattr(transformers, config_cls)(**config)
        model = getattr(transformers, model_cls)(cfg).train()
        if image:
            inputs = [torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))]
            return TupleOutput(model, "pixel_values"), inputs
        inputs = [torch.randint(0, 128, (2, 16)), torch.randint(0, 128, (2, 16))]
        return TupleOutput(model, "input_ids"), inputs

    return build


def function_cases() -> dict[str, Callable[[], tuple[torch.nn.Module, list]]]:
    return {
        "pointwise chain": lambda: (
            traced(lambda x, y: ((x.sin() * y).exp().tanh() + y.cos(),)),
            [rand(64, 64), rand(64, 64)],
        ),
        "matmul + gelu": lambda: (
            traced(lambda x, w: (F.gelu(x @ w),)),
            [rand(32, 64), rand(64, 64)],
        ),
        "layer norm + relu": lambda: (
            traced(lambda x, w, b: (F.relu(F.layer_norm(x, (64,), w, b)),)),
            [rand(16, 32, 64), rand(64), rand(64)],
        ),
        "softmax attention": lambda: (
            traced(lambda q, k, v: ((q @ k.transpose(-1, -2) / 8).softmax(-1) @ v,)),
            [rand(2, 4, 16, 8), rand(2, 4, 16, 8), rand(2, 4, 16, 8)],
        ),
        "mlp + dropout": lambda: (
            traced(
                torch.nn.Sequential(
                    torch.nn.Linear(64, 128),
                    torch.nn.GELU(),
                    torch.nn.Dropout(0.1),
                    torch.nn.Linear(128, 64),
                ).train()
            ),
            [rand(32, 64)],
        ),
        "conv + batchnorm": lambda: (
            traced(
                torch.nn.Sequential(
                    torch.nn.Conv2d(3, 8, 3),
                    torch.nn.BatchNorm2d(8),
                    torch.nn.ReLU(),
                    torch.nn.Conv2d(8, 8, 3),
                    torch.nn.BatchNorm2d(8),
                    torch.nn.SiLU(),
                ).train()
            ),
            [rand(4, 3, 16, 16)],
        ),
        "residual block": lambda: (
            traced(lambda x, w1, w2: (x + torch.tanh(F.silu(x @ w1) * (x @ w2)),)),
            [rand(32, 64), rand(64, 64), rand(64, 64)],
        ),
    }


def model_cases() -> dict[str, Callable[[], tuple[torch.nn.Module, list]]]:
    small = {
        "vocab_size": 128,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 40,
    }
    decoder = {**small, "num_key_value_heads": 1, "max_position_embeddings": 32}
    image = {"num_channels": 3, "num_labels": 10}
    return {
        "BERT (masked LM)": hf_case("BertConfig", "BertForMaskedLM", **small),
        "RoBERTa (masked LM)": hf_case("RobertaConfig", "RobertaForMaskedLM", **small),
        "ELECTRA (masked LM)": hf_case(
            "ElectraConfig", "ElectraForMaskedLM", embedding_size=16, **small
        ),
        "ALBERT (masked LM)": hf_case(
            "AlbertConfig", "AlbertForMaskedLM", embedding_size=16, **small
        ),
        "DistilBERT (masked LM)": hf_case(
            "DistilBertConfig",
            "DistilBertForMaskedLM",
            vocab_size=128,
            dim=32,
            n_layers=2,
            n_heads=2,
            hidden_dim=64,
        ),
        "GPT-2 (causal LM)": hf_case(
            "GPT2Config",
            "GPT2LMHeadModel",
            vocab_size=128,
            n_embd=32,
            n_layer=2,
            n_head=2,
            n_positions=32,
        ),
        "OPT (causal LM)": hf_case(
            "OPTConfig", "OPTForCausalLM", ffn_dim=64, word_embed_proj_dim=32, **small
        ),
        "Llama (causal LM)": hf_case("LlamaConfig", "LlamaForCausalLM", **decoder),
        "Mistral (causal LM)": hf_case("MistralConfig", "MistralForCausalLM", **decoder),
        "T5 (seq2seq LM)": hf_case(
            "T5Config",
            "T5ForConditionalGeneration",
            vocab_size=128,
            d_model=32,
            d_kv=16,
            d_ff=64,
            num_layers=2,
            num_heads=2,
            decoder_start_token_id=0,
        ),
        "ViT (image classification)": hf_case(
            "ViTConfig",
            "ViTForImageClassification",
            image=True,
            image_size=16,
            patch_size=4,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            **image,
        ),
        "ResNet (image classification)": hf_case(
            "ResNetConfig",
            "ResNetForImageClassification",
            image=True,
            embedding_size=8,
            hidden_sizes=[8, 16],
            depths=[1, 1],
            layer_type="basic",
            **image,
        ),
    }


@dataclasses.dataclass
class Row:
    """One case's bytes per stack; ``None`` where the stack did not compile it (``why``)."""

    name: str
    kiln: int | None
    default: int | None
    reference: int | None
    why: list[str]


def attempt(what: str, measure_fn: Callable[[], int], why: list[str], *errors: type) -> int | None:
    """``measure_fn()``, or ``None`` with the reason appended to ``why`` if it raises ``errors``."""
    try:
        return measure_fn()
    except errors as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        why.append(f"{what}: {type(error).__name__}: {first_line}")
        print(f"  {why[-1]}", file=sys.stderr, flush=True)
        return None


def measure(name: str, build: Callable) -> Row:
    print(f"measuring {name}", file=sys.stderr, flush=True)
    module, inputs = build()
    why: list[str] = []
    unsupported = kiln_autograd.UnsupportedError
    kiln = attempt(
        "kiln",
        lambda: kiln_saved_bytes(copy.deepcopy(module), inputs, "min_cut"),
        why,
        unsupported,
    )
    default = attempt(
        "kiln default",
        lambda: kiln_saved_bytes(copy.deepcopy(module), inputs, "default"),
        why,
        unsupported,
    )
    reference = attempt(
        "torch", lambda: torch_saved_bytes(copy.deepcopy(module), inputs), why, Exception
    )
    return Row(name, kiln, default, reference, why)


def cell(value: int | None) -> str:
    return "not supported" if value is None else f"{value:,}"


def main() -> str:
    cases = {**function_cases(), **model_cases()}
    rows = [measure(name, build) for name, build in cases.items()]
    lines = [
        "| case | kiln min-cut (bytes) | kiln default (bytes) | torch min-cut (bytes) "
        "| kiln / torch |",
        "|---|---:|---:|---:|---:|",
    ]
    wins = 0
    measured = [r for r in rows if r.kiln is not None and r.reference is not None]
    for r in rows:
        if r.kiln is not None and r.reference is not None:
            wins += r.kiln <= r.reference
            ratio = f"{r.kiln / r.reference:.2f}" if r.reference else "nan"
        else:
            ratio = "n/a"
        lines.append(
            f"| {r.name} | {cell(r.kiln)} | {cell(r.default)} | {cell(r.reference)} | {ratio} |"
        )
    lines.append("")
    lines.append(
        f"kiln saves no more bytes than torch on {wins} of {len(measured)} cases measured "
        f"by both ({len(rows)} cases)."
    )
    failed = [r for r in rows if r.why]
    if failed:
        lines.append("")
        lines.append("Not supported:")
        lines.append("")
        lines += [f"- {r.name}: {'; '.join(r.why)}" for r in failed]
    return "\n".join(lines)


if __name__ == "__main__":
    print(main())
