"""The op registry: importing this package registers every supported op type."""
from . import elementwise, linear, norms, pooling, resize, select, shape  # noqa: F401  (registration side effects)
from . import transformer  # noqa: F401,E402  (wraps MatMul/Mul/Div/Gather registered above)
from .base import REGISTRY, ActivationOp, LinearOp, Op, Params, RuleOp, ShapeOp, carries, is_param
from . import recurrent  # noqa: F401,E402  (LSTM / GRU / RNN)
from . import quantize  # noqa: F401,E402  (QuantizeLinear / DequantizeLinear)

# ops whose output is >= 0 whenever their relevance inputs are (moves, pools, sums)
PRESERVES_NONNEG = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "ReduceMax", "ReduceMean",
                    "ReduceSum", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Concat", "Split",
                    "Slice", "Gather", "Expand", "Identity", "Cast", "Sum", "Add", "LRN", "Max", "Min",
                    "ReduceMin", "TopK", "Resize", "DepthToSpace", "SpaceToDepth"}

__all__ = ["REGISTRY", "ActivationOp", "LinearOp", "Op", "Params", "RuleOp", "ShapeOp", "carries", "is_param",
           "PRESERVES_NONNEG"]
