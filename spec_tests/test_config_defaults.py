"""Config keys written out with their documented defaults (protocol v2, amendment 31): ``"sliding_window": null``,
``"rope_scaling": null``, ``"n_experts": 0`` mean what leaving the key out means, as Hugging Face's config files
write every key."""

import pytest

from . import models
from .harness.plugin.markers import judges
from .protocol import V2_CAPABILITIES
from .protocol import V2_CONFIG_DEFAULTS as DEFAULTS
from .protocol.names import IMPLIED_BY_V1

pytestmark = pytest.mark.component("model")


def require_key(impl, key: str) -> str:
    """The family to try ``key`` in, or a skip: FIXED_CONFIG sets it otherwise, or the implementation is of protocol
    v1 (no v2 capability declared) and lacks its capability. A v2 implementation takes every v2 key at its default,
    whatever it supports: the key then means what leaving it out means (amendment 31)."""
    capability, _, both = DEFAULTS[key]
    caps = impl.capabilities
    v2 = any(c in V2_CAPABILITIES and c not in IMPLIED_BY_V1 for c in caps)
    held = capability in caps or (capability == "rope_scaling" and any(c.startswith("rope_scaling:") for c in caps))
    if not (held or v2):
        impl.require_capability(capability)
    if key in impl.fixed_config:
        pytest.skip(f"not provided: FIXED_CONFIG sets {key}={impl.fixed_config[key]!r}, not its default")
    if "llama" in impl.families or not both:
        return "llama"
    return "gpt2"


@judges("build_model", uses=("forward",))
@pytest.mark.bug_class("config_defaults")
@pytest.mark.parametrize("key", sorted(DEFAULTS))
def test_a_config_key_written_at_its_default_changes_nothing(spec, key):
    """A config holding a v2 key at its documented default builds the model a config without it builds: the same
    logits as the reference's (protocol: amendment 31)."""
    family = require_key(spec.impl, key)
    default = DEFAULTS[key][1]
    config = models.family_config(spec.impl, family)
    written = dict(config, **{key: default})
    sd = models.random_state_dict(config, seed=311, device=spec.device)
    ids = spec.inputs.token_ids(2, 7, vocab=config["vocab_size"], seed=312)
    models.check_option_logits(
        spec,
        written,
        sd,
        ids,
        behaviour=f"logits of a {family} model whose config writes {key}={default!r} (its default), ids [2, 7]",
    )
