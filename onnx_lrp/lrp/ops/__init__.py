"""The op registry: importing this package registers every supported op type, each exactly once (an op type that
means several things, such as MatMul / Mul / Div / Gather, registers one dispatcher whose ``resolve`` chooses)."""
from . import (elementwise, gates, linear, norms, pooling, products, quantize, recurrent, resize, select,  # noqa: F401
               shape, transformer)
from .base import REGISTRY, ActivationOp, LinearOp, Op, Params, RuleOp, ShapeOp


__all__ = ["REGISTRY", "ActivationOp", "LinearOp", "Op", "Params", "RuleOp", "ShapeOp"]
