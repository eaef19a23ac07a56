"""Property: whatever is wrong with a model, ``Explainer(...).explain(...)`` returns finite relevance of the input's
shape or raises an ``LrpError`` (never another exception, never a refusal that reports an internal error).

Mutations (tests/mutate.py) of four small valid models: flipped bytes, dropped/retyped/odd attributes, changed
input dimensions, ranks and data types, deleted inputs and nodes, NaN/Inf constants, initializers whose shape no
longer fits, ops moved to unknown domains. The offline campaign with the same mutations is scripts/fuzz_models.py.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mutate

SEEDS = mutate.seed_models()


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(sorted(SEEDS)), kind=st.sampled_from(mutate.KINDS), rnd=st.randoms(use_true_random=False),
       comp=st.sampled_from(range(len(mutate.COMPOSITES))))
def test_mutated_models_are_explained_or_refused(name, kind, rnd, comp):
    data = mutate.mutate(SEEDS[name], rnd, kind)
    x = mutate.sample_input(SEEDS[name], rnd)
    composite, params = mutate.COMPOSITES[comp]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result, detail = mutate.outcome(data, x, composite, params)
    assert result in ("ok", "refused"), f"{result}: {detail} ({name}/{kind}, {composite})"


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_seed_models_are_valid(name):
    """The seeds themselves explain (with a composite that has a rule for all their ops) to finite relevance."""
    composite, params = ("attnlrp", {}) if name == "seq" else ("epsilon-plus-flat", {})
    dims = [d.dim_value for d in SEEDS[name].graph.input[0].type.tensor_type.shape.dim[1:]]
    x = np.random.default_rng(0).standard_normal([2] + dims).astype(np.float32)
    assert mutate.outcome(SEEDS[name].SerializeToString(), x, composite, params) == ("ok", "")
