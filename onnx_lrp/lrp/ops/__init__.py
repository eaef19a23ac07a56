"""The op registry: importing this package registers every supported op type, each exactly once (an op type that
means several things, such as MatMul / Mul / Div / Gather, registers one dispatcher whose ``resolve`` chooses)."""
from . import elementwise, linear, norms, pooling, quantize, recurrent, resize, select, shape, transformer  # noqa: F401
from .base import REGISTRY, ActivationOp, LinearOp, Op, Params, RuleOp, ShapeOp


__all__ = ["REGISTRY", "ActivationOp", "LinearOp", "Op", "Params", "RuleOp", "ShapeOp"]
