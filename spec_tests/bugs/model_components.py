"""The ``component=`` names that the model-level spec tests pass to ``spec.check`` and ``require``.

A mistake inside the model shows in every check downstream of a forward pass; these groups keep
the catalog's ``components`` in step with the test files in one place.
"""

from __future__ import annotations

FORWARD = ("model",)  # test_model: logits, tying, counts
CACHE = ("kv_cache",)  # test_kv_cache: cached logits, cache contents
GENERATION = ("generation",)  # test_generation
SAMPLING = ("sampling",)  # test_sampling: sampling_probs and sample
TRAINING = ("training", "train_step")  # test_training: batches, train_step, train
EVALUATION = ("evaluate",)  # test_training: evaluate
INIT = ("init",)  # test_model: initialisation statistics

# A mistake in the model's forward pass reaches every one of these.
MODEL = FORWARD + CACHE + GENERATION + TRAINING + EVALUATION
MODEL_LLAMA = MODEL  # mistakes only the llama family exercises (RMSNorm, RoPE, SwiGLU)
MODEL_GPT2 = MODEL  # mistakes only the gpt2 family exercises (LayerNorm, GELU, learned positions)
