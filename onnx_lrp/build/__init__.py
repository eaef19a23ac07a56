"""Building a relevance model: the automatic composite, the float16 / bfloat16 precision pass and computed weights."""
