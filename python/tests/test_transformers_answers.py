"""Clear answers from the transformers integration where it gave wrong or unclear ones: options
that must be True/False, a config of another model, a block without its layer index, MoE families
moekit does not run, and a dtype conversion moekit does not run (.half())."""
import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import moekit  # noqa: E402
import moekit.nn  # noqa: E402
import moekit.transformers as mt  # noqa: E402
from test_transformers import input_ids, make_model, rel  # noqa: E402

TINY = dict(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64)


def test_yes_no_options_take_only_true_or_false(tmp_path):
    """capture="no" was True, keep_packed_weights="no" loaded packed."""
    model = make_model("qwen3_moe")
    block = model.model.layers[0].mlp
    with pytest.raises(TypeError, match="capture: expected True or False, got 'no'"):
        moekit.nn.MoE(block, model.config, 0, capture="no")
    with pytest.raises(TypeError, match="batch_invariant: expected True or False, got 1"):
        moekit.nn.MoE(block, model.config, 0, batch_invariant=1)
    with pytest.raises(TypeError, match="keep_packed_weights: expected True or False, got 'no'"):
        moekit.MoeLayer.from_pretrained(tmp_path, 0, keep_packed_weights="no")
    with pytest.raises(TypeError, match="strict: expected True or False, got 'yes'"):
        mt.patch(model, strict="yes")
    assert not any(isinstance(layer.mlp, moekit.nn.MoE) for layer in model.model.layers)
    numpy = pytest.importorskip("numpy")
    assert moekit.nn.MoE(block, model.config, 0, capture=numpy.bool_(False)).options["capture"] is False


def test_a_config_of_another_model_is_refused():
    """A Mixtral block with a Qwen3 config ran Qwen3's top-k; None or a dict was an AttributeError."""
    mixtral, qwen = make_model("mixtral"), make_model("qwen3_moe")
    block = mixtral.model.layers[0].mlp
    with pytest.raises(ValueError, match="model_type 'qwen3_moe' is not the family of a MixtralSparseMoeBlock"):
        moekit.nn.MoE(block, qwen.config, 0)
    for bad in (None, mixtral.config.to_dict()):
        with pytest.raises(TypeError, match="model_config: expected the model's transformers config"):
            moekit.nn.MoE(block, bad, 0)
    # The family's own config, with another top-k: the block's router says its own.
    other_k = copy.deepcopy(qwen.config)
    other_k.num_experts_per_tok = 2
    with pytest.raises(ValueError, match="model_config: says top_k = 2, but the block's .*top_k is 3"):
        moekit.nn.MoE(qwen.model.layers[0].mlp, other_k, 0)


def test_from_transformers_needs_the_layer_index():
    """It defaulted to 0, so DeepSeek-V3's layer-1 block was refused as a dense layer."""
    model = make_model("deepseek_v3")
    block = model.model.layers[1].mlp
    with pytest.raises(ValueError, match="layer_index: required"):
        moekit.nn.MoE.from_transformers(block, model.config)
    moe = moekit.nn.MoE.from_transformers(block, model.config, layer_index=1)
    x = torch.randn(5, model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert rel(moe(x), block(x)) <= 1e-5


@pytest.mark.parametrize("family", [
    ("OlmoeConfig", "OlmoeForCausalLM", dict(intermediate_size=32, num_experts=4, num_experts_per_tok=2)),
    ("GraniteMoeConfig", "GraniteMoeForCausalLM", dict(intermediate_size=32, num_local_experts=4,
                                                       num_experts_per_tok=2)),
    ("Llama4TextConfig", "Llama4ForCausalLM", dict(intermediate_size=32, intermediate_size_mlp=64,
                                                   num_local_experts=4, num_experts_per_tok=1, head_dim=16)),
], ids=["olmoe", "granitemoe", "llama4"])
def test_moe_families_moekit_does_not_run_are_named_as_such(family):
    """They were reported as "a dense MLP" (OLMoE) or block NoneType (Llama4, GraniteMoE keep theirs
    under other names)."""
    cfg_name, model_name, fields = family
    if not hasattr(transformers, model_name):
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    model = getattr(transformers, model_name)(getattr(transformers, cfg_name)(**TINY, **fields))
    report = mt.patch(model)
    assert report["patched"] == []
    assert [r["layer"] for r in report["left"]] == [0, 1]
    for r in report["left"]:
        assert r["block"] != "NoneType"
        assert r["reason"].startswith(f"an MoE block of a family moekit does not run ({model.config.model_type};")
    with pytest.raises(ValueError, match="is not a sparse-MoE block moekit runs"):
        moekit.nn.MoE(next(m for m in model.modules() if type(m).__name__ == report["left"][0]["block"]),
                      model.config, 0)


def test_half_runs_transformers_forward_and_bfloat16_brings_moekit_back():
    """.half() on a patched model: moekit does not run f16 weights, and torch has converted part of the
    model before it reaches a MoE block, so the blocks run transformers' forward (with a warning), not a
    half-converted model that fails on its next forward; a conversion moekit runs brings it back."""
    model, plain = make_model("qwen3_moe"), make_model("qwen3_moe")
    ids = input_ids("qwen3_moe")
    mt.patch(model)
    with pytest.warns(RuntimeWarning, match="layer 0 runs transformers' forward after this conversion: .*F16"):
        model.half()
    plain.half()
    moes = [layer.mlp for layer in model.model.layers]
    assert all(m.runs_transformers is not None for m in moes)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, plain(ids).logits)  # the same modules, the same f16 forward
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.bfloat16()
    plain.bfloat16()
    assert all(m.runs_transformers is None and m.layer.config.weight_dtype == "bf16" for m in moes)
    with torch.no_grad():
        ref = plain.float()(ids).logits
        ours = model(ids).logits.float()
        assert rel(ours, ref) <= 2e-2  # bf16 forward against the f32 one of the same (rounded) weights
