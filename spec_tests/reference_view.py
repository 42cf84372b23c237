"""The reference, or a catalog copy of it, bound to the RoPE style the implementation declares."""

from __future__ import annotations

import functools

_STYLE_KEYWORD = {"rope": "style", "multihead_self_attention": "rope_style", "build_model": "rope_style"}


class StyledReference:
    """Attribute access to a reference-like module with its RoPE style fixed to ``rope_style``."""

    def __init__(self, module, rope_style: str, label: str = "reference"):
        self.module, self.rope_style, self.label = module, rope_style, label

    def __getattr__(self, name: str):
        fn = getattr(self.module, name)
        keyword = _STYLE_KEYWORD.get(name)
        return functools.partial(fn, **{keyword: self.rope_style}) if keyword else fn

    def __repr__(self) -> str:
        return f"StyledReference({self.label}, rope_style={self.rope_style!r})"


@functools.cache
def reference_module():
    """The live reference package (absent from student handouts)."""
    import reference

    return reference
