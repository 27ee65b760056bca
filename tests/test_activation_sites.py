"""Activation patching's sites (``headlab.core.activation_sites``) on every family's tiny model, in float64, against
a forward whose activation is replaced by a hook written here, on the module the definition names: the output
projection's input (a head's columns), its output (the attention block), the feed-forward block's last linear map
(the MLP), the layer's output (the residual stream after it)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from families import CONFIGS, batch, tiny_model

from headlab.core.activation_sites import SITE_KINDS, Patch, Site, patched, recorded
from headlab.errors import UserError

# model_type -> (the layers' list, from a layer: the output projection, the MLP's last linear map, the query, key
# and value projections); ALBERT's below
MODULES = {"bert": ("encoder.layer", "attention.output.dense", "output.dense",
                    ("attention.self.query", "attention.self.key", "attention.self.value")),
           "deberta-v2": ("encoder.layer", "attention.output.dense", "output.dense",
                          ("attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj")),
           "distilbert": ("transformer.layer", "attention.out_lin", "ffn.lin2",
                          ("attention.q_lin", "attention.k_lin", "attention.v_lin")),
           "modernbert": ("layers", "attn.Wo", "mlp.Wo", ("attn.Wqkv",) * 3),
           "albert": ("encoder.albert_layer_groups", "attention.dense", "ffn_output",
                      ("attention.query", "attention.key", "attention.value"))}
HEAD_DIM = 8  # every tiny model: hidden 32 over 4 heads
INPUTS = ("query", "key", "value")


def get(root, path: str):
    for name in path.split("."):
        root = root[int(name)] if name.isdigit() else getattr(root, name)
    return root


def module_and_call(model, name: str, kind: str, layer: int) -> tuple[torch.nn.Module, int]:
    """The module whose output (input, for a head) is the site's activation, and which of its calls in a forward
    is depth ``layer``'s (ALBERT: a group's layer serves consecutive depths)."""
    family = "albert" if name.startswith("albert") else "deberta-v2" if name.startswith("deberta") else \
        name if name in MODULES else "bert"
    layers_path, projection, mlp, inputs = MODULES[family]
    call = 0
    if family == "albert":
        config = model.config
        per_group = config.num_hidden_layers // config.num_hidden_groups
        block, call = get(model, layers_path)[layer // per_group].albert_layers[0], layer % per_group
    else:
        block = get(model, layers_path)[layer]
    path = inputs[INPUTS.index(kind)] if kind in INPUTS else mlp if kind == "mlp" else projection
    return (block if kind == "residual" else get(block, path)), call


@contextmanager
def by_definition(model, name: str, kind: str, layer: int, change):
    """``change(activation [batch, seq, width])`` at the site, by a hook on the module the definition names: the
    residual stream after a layer is the next layer's input (the last layer's: its output)."""
    next_input = kind == "residual" and layer + 1 < model.config.num_hidden_layers
    module, call = module_and_call(model, name, kind, layer + next_input)
    calls = [0]

    def at_call(values):
        calls[0] += 1
        if calls[0] - 1 != call:
            return None
        tensor = values[0] if isinstance(values, tuple) else values
        new = change(tensor)
        return None if new is None else (new, *values[1:]) if isinstance(values, tuple) else new

    def layer_input(module, args, kwargs):  # the hidden states, given by position or by name
        if "hidden_states" in kwargs:
            new = at_call((kwargs["hidden_states"],))
            return None if new is None else (args, {**kwargs, "hidden_states": new[0]})
        new = at_call(args)
        return None if new is None else (new, kwargs)

    handle = (module.register_forward_pre_hook(layer_input, with_kwargs=True) if next_input
              else module.register_forward_pre_hook(lambda m, args: at_call(args)) if kind == "head"
              else module.register_forward_hook(lambda m, args, output: at_call(output)))
    try:
        yield
    finally:
        handle.remove()


def inputs(seed: int) -> dict:
    rows = batch(seed)
    return {"input_ids": rows["input_ids"], "attention_mask": rows["attention_mask"]}


def run(model, rows) -> torch.Tensor:
    with torch.no_grad():
        return model(**rows).last_hidden_state


@pytest.fixture(params=list(CONFIGS), scope="module")
def family(request):
    return request.param, tiny_model(request.param).double()


def site_of(kind: str, layer: int = 1) -> Site:
    return Site(kind, layer, 2 if kind in ("head", *INPUTS) else None)


def head_columns(name: str, kind: str, head: int = 2) -> slice:
    """A head's columns of the site's activation (ModernBERT's Wqkv: query, key and value blocks of 4 heads)."""
    if kind not in ("head", *INPUTS):
        return slice(None)
    start = (INPUTS.index(kind) * 4 * HEAD_DIM if name == "modernbert" and kind in INPUTS else 0) + head * HEAD_DIM
    return slice(start, start + HEAD_DIM)


@pytest.mark.parametrize("kind", SITE_KINDS)
def test_recorded_activations_are_the_modules_own(family, kind):
    name, model = family
    site, seen = site_of(kind), []
    with recorded(model, [site]) as found, by_definition(model, name, kind, 1, seen.append):
        run(model, inputs(1))
    assert torch.equal(found[(kind, 1)], seen[0])


@pytest.mark.parametrize("where", ["every position", "some positions"])
@pytest.mark.parametrize("kind", SITE_KINDS)
def test_a_patch_equals_a_forward_with_that_activation_replaced(family, kind, where):
    name, model = family
    clean, corrupted, site = inputs(1), inputs(2), site_of(kind)
    assert torch.equal(clean["attention_mask"], corrupted["attention_mask"])
    with recorded(model, [site]) as found:
        run(model, corrupted)
    source = found[(kind, 1)]
    positions = None if where == "every position" else torch.arange(11)[None, :].expand(3, 11) % 3 == 1
    with patched(model, [Patch(site, source, positions)]):
        out = run(model, clean)

    def replace(activation):  # the definition: the site's columns from the source, at the chosen positions
        new = activation.clone()
        cols = head_columns(name, kind)
        for b in range(3):
            for t in range(11):
                if positions is None or positions[b, t]:
                    new[b, t, cols] = source[b, t, cols]
        return new

    with by_definition(model, name, kind, 1, replace):
        expected = run(model, clean)
    assert torch.equal(out, expected)
    assert not torch.allclose(out, run(model, clean))  # the patch changed something


def test_a_patch_of_nothing_is_the_clean_run(family):
    _, model = family
    clean, corrupted, site = inputs(1), inputs(2), site_of("residual")
    with recorded(model, [site]) as found:
        run(model, corrupted)
    with patched(model, []):
        assert torch.equal(run(model, clean), run(model, clean))
    nowhere = torch.zeros(3, 11, dtype=torch.bool)
    with patched(model, [Patch(site, found[("residual", 1)], nowhere)]):
        out = run(model, clean)
    assert torch.equal(out, run(model, clean))


@pytest.mark.parametrize("layer", [0, 2])
def test_the_residual_patched_everywhere_is_the_other_run_from_there(family, layer):
    """Noising (the clean run takes the corrupted residual) gives the corrupted run; denoising the clean one."""
    _, model = family
    clean, corrupted = inputs(1), inputs(2)
    site = Site("residual", layer)
    for run_inputs, source_inputs in ((clean, corrupted), (corrupted, clean)):
        with recorded(model, [site]) as found:
            source_out = run(model, source_inputs)
        with patched(model, [Patch(site, found[("residual", layer)])]):
            out = run(model, run_inputs)
        torch.testing.assert_close(out, source_out, rtol=1e-12, atol=1e-12)


def test_bad_sites_and_sources_are_refused(family):
    _, model = family
    with pytest.raises(UserError, match="site kind 'ffn' is not one of head, attention, mlp, residual"):
        Site("ffn", 0)
    with pytest.raises(UserError, match="a head site needs head"):
        Site("head", 0)
    with pytest.raises(UserError, match="a mlp site takes no head"):
        Site("mlp", 0, 1)
    layers = model.config.num_hidden_layers
    with pytest.raises(UserError, match=rf"site L{layers}\.mlp: the model has layers 0-{layers - 1} and heads 0-3"), \
            recorded(model, [Site("mlp", layers)]):
        pass
    with pytest.raises(UserError, match=r"site L1H2: the source activation has shape \[3, 10, 32\]; this "
                                        r"forward's is \[3, 11, 32\]"), \
            patched(model, [Patch(Site("head", 1, 2), torch.zeros(3, 10, 32, dtype=torch.float64))]):
        run(model, inputs(1))
