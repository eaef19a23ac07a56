"""Errors with one-line messages that name the file, node or op and say what to do."""
from __future__ import annotations


class LrpError(ValueError):
    """Base class: the message is one line, fit for a command line without a traceback."""


class ModelError(LrpError):
    """The model file is missing, unreadable or not a valid ONNX model."""


class InputError(LrpError):
    """An input array or argument does not fit the model."""


class UnsupportedError(LrpError):
    """Nodes the rewriter cannot handle; ``nodes`` lists every one, not only the first."""

    def __init__(self, nodes: list[dict], hint: str):
        self.nodes = nodes
        listed = "; ".join(f"{n['name']} ({n['domain'] or 'ai.onnx'}::{n['op_type']}, opset {n['opset']}: "
                           f"{n['reason']})" for n in nodes)
        super().__init__(f"{len(nodes)} unsupported node(s): {listed}. {hint}" if nodes else hint)


class NumericError(LrpError):
    """The explained output or the relevance is NaN or infinite; the message names the first node where it
    became so and the rule applied there."""


class InternalError(LrpError):
    """An unexpected failure inside onnx-lrp while building the relevance model (a bug: please report it)."""


class DeviceError(LrpError):
    """The requested execution device is not available."""


def internal_error(node, exc: BaseException) -> InternalError:
    """An unexpected exception while handling ``node`` (None: outside any node) as one line that names it."""
    where = f"node {node.name} ({node.domain or 'ai.onnx'}::{node.op_type})" if node is not None else "onnx-lrp"
    text = " ".join(str(exc).split())[:200]
    return InternalError(f"internal error in {where}: {type(exc).__name__}: {text}. This is a bug in onnx-lrp "
                         "(or a malformed model it failed to recognise); please report it with the model")
