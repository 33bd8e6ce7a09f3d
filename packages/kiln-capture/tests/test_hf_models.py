"""Hugging Face models built from small configs (random weights) capture in one graph each."""

import pytest
import torch

import kiln_capture

transformers = pytest.importorskip("transformers")


SMALL = dict(
    vocab_size=128,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)


def token_ids():
    return {"input_ids": torch.randint(0, 128, (2, 8))}


def pixels():
    return {"pixel_values": torch.randn(2, 3, 32, 32)}


def bert():
    return transformers.BertModel(transformers.BertConfig(**SMALL)), token_ids


def gpt2():
    config = transformers.GPT2Config(
        vocab_size=128,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config), token_ids


def llama():
    config = transformers.LlamaConfig(**SMALL, num_key_value_heads=2)
    return transformers.LlamaForCausalLM(config), token_ids


def t5():
    config = transformers.T5Config(
        vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4
    )
    return transformers.T5Model(config), lambda: {
        "input_ids": torch.randint(0, 128, (2, 8)),
        "decoder_input_ids": torch.randint(0, 128, (2, 6)),
    }


def vit():
    config = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
    )
    return transformers.ViTModel(config), pixels


MODELS = {"bert": bert, "gpt2": gpt2, "llama": llama, "t5": t5, "vit": vit}

# More architectures, run in the integration session.
MORE_MODELS = {
    "roberta": lambda: (
        transformers.RobertaModel(transformers.RobertaConfig(**SMALL, pad_token_id=1)),
        token_ids,
    ),
    "distilbert": lambda: (
        transformers.DistilBertModel(
            transformers.DistilBertConfig(
                vocab_size=128,
                dim=32,
                n_layers=2,
                n_heads=4,
                hidden_dim=64,
                max_position_embeddings=64,
            )
        ),
        token_ids,
    ),
    "albert": lambda: (
        transformers.AlbertModel(transformers.AlbertConfig(**SMALL, embedding_size=16)),
        token_ids,
    ),
    "electra": lambda: (
        transformers.ElectraModel(transformers.ElectraConfig(**SMALL, embedding_size=16)),
        token_ids,
    ),
    "mistral": lambda: (
        transformers.MistralForCausalLM(transformers.MistralConfig(**SMALL, num_key_value_heads=2)),
        token_ids,
    ),
    "qwen2": lambda: (
        transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SMALL, num_key_value_heads=2)),
        token_ids,
    ),
    "opt": lambda: (
        transformers.OPTForCausalLM(
            transformers.OPTConfig(
                vocab_size=128,
                hidden_size=32,
                num_hidden_layers=2,
                ffn_dim=64,
                num_attention_heads=4,
                max_position_embeddings=64,
                word_embed_proj_dim=32,
            )
        ),
        token_ids,
    ),
    "bart": lambda: (
        transformers.BartModel(
            transformers.BartConfig(
                vocab_size=128,
                d_model=32,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                max_position_embeddings=64,
            )
        ),
        token_ids,
    ),
    "gpt_neox": lambda: (
        transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**SMALL)),
        token_ids,
    ),
    "swin": lambda: (
        transformers.SwinModel(
            transformers.SwinConfig(
                image_size=32,
                patch_size=4,
                embed_dim=16,
                depths=[1, 1],
                num_heads=[2, 2],
                window_size=4,
            )
        ),
        pixels,
    ),
    "resnet": lambda: (
        transformers.ResNetModel(
            transformers.ResNetConfig(
                embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic"
            )
        ),
        pixels,
    ),
}


def main_output(out):
    return out.last_hidden_state if "last_hidden_state" in out else out.logits


@pytest.mark.parametrize("name", sorted(MODELS))
def test_inference_is_one_graph_equal_to_eager(name):
    check_one_graph(*MODELS[name]())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MORE_MODELS))
def test_more_architectures_are_one_graph_equal_to_eager(name):
    check_one_graph(*MORE_MODELS[name]())


def capture_eval(model) -> tuple[object, list]:
    """``model`` in eval mode, captured, and the list its graphs are appended to."""
    model.eval()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return kiln_capture.capture(model, backend), graphs


def check_one_graph(model, make_inputs):
    torch.manual_seed(0)
    captured, graphs = capture_eval(model)
    for _ in range(2):  # the second call runs the cached capture
        inputs = make_inputs()
        with torch.no_grad():
            expected = model(**inputs)
            actual = captured(**inputs)
        assert type(actual) is type(expected)
        torch.testing.assert_close(main_output(actual), main_output(expected))
    assert len(graphs) == 1, f"{type(model).__name__} broke into {len(graphs)} graphs"
    assert captured._captured.stats.eager_reason is None


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_growing_sequence_lengths_capture_once_per_size_family(name):
    # the first new length makes it symbolic; HF's shape code (`(-1,) + input_shape[1:]`,
    # comparisons of lengths) keeps it so, with no graph break
    torch.manual_seed(0)
    model, _ = MODELS[name]()
    captured, graphs = capture_eval(model)
    with torch.no_grad():
        for length in range(5, 15):
            input_ids = torch.randint(0, 128, (2, length))
            actual, expected = captured(input_ids), model(input_ids)
            torch.testing.assert_close(actual[0], expected[0])
    assert len(graphs) == 2
    stats = captured._captured.stats
    assert stats.made_dynamic == [["args[0].size(1)"]] and stats.eager_reason is None
    assert not any(callee.entries for callee in captured._captured.callees.values())


def test_training_step_matches_eager_with_the_same_seed():
    """Dropout draws the same masks (the graph runs the ops in eager's order) and gradients
    flow through the captured graph."""
    torch.manual_seed(0)
    model, make_inputs = bert()
    model.train()
    captured = kiln_capture.capture(model, lambda gm, example_inputs: gm.forward)
    inputs = make_inputs()
    results = []
    for fn in (model, captured):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1234)
        loss = fn(**inputs).last_hidden_state.square().mean()
        loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        results.append((loss.detach(), grads))
    (eager_loss, eager_grads), (captured_loss, captured_grads) = results
    torch.testing.assert_close(captured_loss, eager_loss)
    assert captured_grads.keys() == eager_grads.keys()
    for name, grad in eager_grads.items():
        torch.testing.assert_close(captured_grads[name], grad, msg=name)


def test_model_output_is_built_as_its_constructor_builds_it():
    from kiln_capture.model_outputs import ModelOutputBuilder

    model, make_inputs = bert()
    model.eval()
    captured = kiln_capture.capture(model, lambda gm, example_inputs: gm.forward)
    inputs = make_inputs()
    with torch.no_grad():
        captured(**inputs)
        actual, expected = captured(**inputs), model(**inputs)
    epilogue = captured._captured.entries[0].result.after_graph[2]
    assert any(isinstance(c, ModelOutputBuilder) for c in epilogue.__code__.co_consts)
    assert type(actual) is type(expected)
    assert list(actual.keys()) == list(expected.keys())
    assert list(vars(actual)) == list(vars(expected))
    assert [k for k, v in vars(actual).items() if v is None] == [
        k for k, v in vars(expected).items() if v is None
    ]
    for got, want in zip(actual.to_tuple(), expected.to_tuple(), strict=True):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(actual[0], expected[0])
    torch.testing.assert_close(actual["pooler_output"], expected.pooler_output)


def test_a_changed_config_attribute_recompiles():
    model, make_inputs = bert()
    captured, graphs = capture_eval(model)
    inputs = make_inputs()
    with torch.no_grad():
        captured(**inputs)
        model.config._attn_implementation = "eager"  # softmax(q k^T) v instead of sdpa
        actual, expected = captured(**inputs), model(**inputs)
        torch.testing.assert_close(actual.last_hidden_state, expected.last_hidden_state)
        assert len(graphs) == 2
        assert any("softmax" in str(n.target) for n in graphs[1].graph.nodes)
        model.config.return_dict = False  # a tuple comes back
        actual, expected = captured(**inputs), model(**inputs)
    reasons = captured._captured.stats.recompile_reasons
    # read past the config's __getattribute__, as what it reads
    assert reasons[0] == (
        "___object_getattribute(self.config, '_attn_implementation_internal') == 'sdpa', "
        "now 'eager'"
    )
    assert reasons[1] == "___object_getattribute(self.config, 'return_dict') is True, now False"
    assert type(actual) is tuple
    torch.testing.assert_close(actual, expected)


def test_a_model_output_class_changed_after_capture_is_built_by_its_constructor():
    from kiln_capture.model_outputs import ModelOutputBuilder

    output_class = transformers.modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions
    builder = ModelOutputBuilder(output_class, ["last_hidden_state", "pooler_output"])
    hidden, pooled = torch.randn(1, 2, 4), torch.randn(1, 4)
    built = builder(hidden, pooled)
    assert list(built.keys()) == ["last_hidden_state", "pooler_output"]
    original = output_class.__post_init__
    seen = []

    def post_init(self):
        seen.append(self)
        original(self)

    output_class.__post_init__ = post_init
    try:
        rebuilt = builder(hidden, pooled)
    finally:
        output_class.__post_init__ = original
    assert len(seen) == 1 and seen[0] is rebuilt, "the constructor ran"
    assert list(rebuilt.keys()) == list(built.keys())
