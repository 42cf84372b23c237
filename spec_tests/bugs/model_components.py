"""The groups of model-level checks a catalogued bug can change (a bug's ``components``).

Diagnosis maps each check's subject to these groups (``CATALOG_GROUPS`` in
``spec_tests/harness/diagnosis/catalog.py``). A mistake inside the model shows in every check
downstream of a forward pass; the groups keep the catalog's ``components`` in one place.
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
