"""Behaviour is observed however the implementation routes it (protocol amendment 13).

``canonical_state_dict`` is specified as "the weights under canonical names": the parameters
themselves, views of them or copies all meet it. Tests that need to know which parameter a
canonical weight is (tying, gradients under canonical names) must find it in each case, and
still catch a head that was copied rather than shared.
"""

from __future__ import annotations

from pathlib import Path

from ahead import run_ahead  # tests/ahead.py: run by a runner process while other tests run
from suite_subprocess import implementation, statuses

SELECT = "tied_head or train_step or train_defaults or cache_holds"
TIED = "test_model.py::test_tied_head_is_the_embedding_parameter[llama]"


def _copies(folder: Path) -> None:
    """canonical_state_dict returns copies of the parameters, not the parameters."""
    path = folder / "model.py"
    source = path.read_text()
    old = "return {name: p.detach() for name, p in model.named_parameters()}"
    assert source.count(old) == 1
    path.write_text(source.replace(old, "return {name: p.detach().clone() for name, p in model.named_parameters()}"))


@run_ahead
def test_canonical_copies_are_judged_like_the_parameters(tmp_path):
    found = statuses(implementation(tmp_path, edit=_copies), tmp_path, SELECT)
    assert found[TIED] == "PASSED"
    assert set(found.values()) <= {"PASSED", "SKIPPED"}, {k: v for k, v in found.items() if v != "PASSED"}


@run_ahead
def test_canonical_copies_still_catch_a_copied_head(tmp_path):
    found = statuses(implementation(tmp_path, "tied_weights_copied", edit=_copies), tmp_path, "tied_head")
    assert found[TIED] == "FAILED", found


@run_ahead
def test_canonical_copies_keep_a_model_bug_out_of_train_step(tmp_path):
    """The own-model expectation of train_step reads gradients under canonical names: with copies,
    train_step is still judged relative to the failing model, not charged for it."""
    folder = implementation(tmp_path, "missing_final_norm", edit=_copies)
    found = statuses(folder, tmp_path, f"{SELECT} or logits_match")
    assert found["test_model.py::test_logits_match_reference[llama_gqa-f64]"] == "FAILED"
    training = {k: v for k, v in found.items() if k.startswith("test_training.py::test_train_step")}
    assert "CONSEQUENCE" in training.values() and "FAILED" not in training.values(), training


def test_a_padded_vocabulary_holds_the_tied_embedding_as_a_slice():
    """A vocabulary padded to a multiple of 128 (Megatron, nanoGPT; held out: a Megatron-style library disputed the
    tying test) holds the canonical embedding as the first V rows of a larger parameter: that parameter is found as
    the embedding's, and its gradient is read at those rows. The control: a head copied into a parameter of its own
    shows as a second matrix of that shape (what the tying test counts)."""
    from types import SimpleNamespace

    import torch

    from spec_tests.harness.subject.model_ops import embedding_grad, parameter_facts

    v, d = 5, 3

    class Padded(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.other = torch.nn.Parameter(torch.randn(4, dtype=torch.float64))
            self.emb = torch.nn.Parameter(torch.randn(v + 3, d, dtype=torch.float64))

    impl = SimpleNamespace(
        canonical_state_dict=lambda m: {"other": m.other.detach(), "tok_embeddings.weight": m.emb.detach()[:v]},
        forward=lambda m, ids: (m.emb[ids] @ m.emb.T)[..., :v],
    )
    model, ids = Padded(), torch.tensor([[0, 3, 4]])
    facts = parameter_facts(impl, model)
    assert facts["embedding"] == 1 and facts["shapes"][1] == [v + 3, d], facts
    grad = embedding_grad(impl, model, ids)
    want = torch.autograd.grad(impl.forward(model, ids).pow(2).mean(), model.emb)[0][:v]
    assert grad.shape == (v, d) and torch.allclose(grad, want), (grad, want)

    model.head = torch.nn.Parameter(model.emb.detach().clone())  # the head a copy: two such matrices
    facts = parameter_facts(impl, model)
    assert facts["embedding"] == 1 and sum(s == [v + 3, d] for s in facts["shapes"]) == 2, facts


def test_parameter_order_follows_the_models_own_parameters():
    """An optimizer loops over model.parameters(); an order-dependent slip (a step count read per parameter, held-out
    batch 60) follows that order, which is not the canonical one: parameter_order gives the canonical names in it,
    names sharing one parameter (a fused qkv) in one group, in their canonical order."""
    from types import SimpleNamespace

    import torch

    from spec_tests.harness.subject.model_ops import parameter_order

    class Fused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Parameter(torch.randn(2, 3, dtype=torch.float64))
            self.qkv = torch.nn.Parameter(torch.randn(6, 3, dtype=torch.float64))
            self.emb = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.float64))

    impl = SimpleNamespace(
        canonical_state_dict=lambda m: {
            "tok_embeddings.weight": m.emb.detach(),
            "wq": m.qkv.detach()[:2],
            "wk": m.qkv.detach()[2:4],
            "wv": m.qkv.detach()[4:],
            "lm_head.weight": m.head.detach(),
        }
    )
    assert parameter_order(impl, Fused()) == [["lm_head.weight"], ["wq", "wk", "wv"], ["tok_embeddings.weight"]]
