"""Composites that ``extends`` a shared base block resolve to the same rules as the block written out in full."""
import itertools

import pytest

from onnx_lrp.lrp.composite_check import known_kinds
from onnx_lrp.rules.composite import BASE_DIR, BUILTIN_DIR, NodeInfo, builtin_names, load_composite, parse_composite


def _inlined(name: str) -> str:
    """The composite's TOML with its base block pasted in (the form of the files before ``extends``)."""
    text = (BUILTIN_DIR / f"{name}.toml").read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if not ln.startswith("extends")]
    base = next(ln for ln in text.splitlines() if ln.startswith("extends")).split('"')[1]
    return "\n".join(lines) + "\n\n" + (BASE_DIR / f"{base}.toml").read_text(encoding="utf-8")


EXTENDING = [n for n in builtin_names() if "extends" in (BUILTIN_DIR / f"{n}.toml").read_text(encoding="utf-8")]


def test_six_builtins_share_the_base_block():
    assert len(EXTENDING) == 6 and "epsilon-plus" in EXTENDING and "attnlrp" not in EXTENDING


@pytest.mark.parametrize("name", EXTENDING)
def test_extends_resolves_as_the_inlined_block(name):
    comp, flat = load_composite(name), parse_composite(_inlined(name), source=name)
    assert comp.entries == flat.entries
    for kind, first in itertools.product(sorted(known_kinds()), (False, True)):
        info = NodeInfo("n", "Conv", kind, first)
        assert comp.rule_for(info) == flat.rule_for(info)


def test_epsilon_plus_and_flat_differ_only_in_the_first_layer():
    plus, flat = load_composite("epsilon-plus"), load_composite("epsilon-plus-flat")
    assert flat.entries[1:] == plus.entries
    assert flat.entries[0].rule.name == "flat"


def test_extends_an_unknown_base_is_refused():
    with pytest.raises(ValueError, match="extends"):
        parse_composite('extends = "nope"\n[[rules]]\nrule = "epsilon"\n', source="c")
