"""The relevance stage: the op handlers (``ops/``), the rule engine (``engine``), the transformer patterns, the
conservation ledger, the composite checks and the rewriter that walks the graph once and appends the relevance."""
