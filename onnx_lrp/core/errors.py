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

    MAX_GROUPS = 4  # causes listed in the message; ``nodes`` (and `onnx-lrp inspect`) have them all
    ALL_NAMES = 12  # up to this many unsupported nodes, the message names every one

    def __init__(self, nodes: list[dict], hint: str):
        self.nodes = nodes
        by_reason: dict[str, dict[str, list[str]]] = {}
        for n in nodes:  # one cause, listed once with its op counts ("23 x Softmax: ...")
            domain = n["domain"] or "ai.onnx"
            op = n["op_type"] if domain == "ai.onnx" else f"{domain}::{n['op_type']}"
            by_reason.setdefault(n["reason"], {}).setdefault(f"{op} (opset {n['opset']})", []).append(n["name"])
        every = len(nodes) <= self.ALL_NAMES  # few: every name; many: the first of each op ("..." for the rest)
        parts = []
        for reason, ops in list(by_reason.items())[:self.MAX_GROUPS]:
            counted = ", ".join(f"{len(names)} x {op} [{', '.join(names) if every else names[0]}"
                                + ("" if every or len(names) == 1 else ", ...") + "]" for op, names in ops.items())
            parts.append(f"{counted}: {reason}")
        if len(by_reason) > self.MAX_GROUPS:
            parts.append(f"and {len(by_reason) - self.MAX_GROUPS} more cause(s)")
        if "inspect" not in hint:
            hint += " `onnx-lrp inspect MODEL` lists every node."
        super().__init__(f"{len(nodes)} unsupported node(s): {'; '.join(parts)}. {hint}" if nodes else hint)


class NumericError(LrpError):
    """The explained output or the relevance is NaN or infinite; the message names the first node where it
    became so and the rule applied there."""


class InternalError(LrpError):
    """An unexpected failure inside onnx-lrp while building the relevance model (a bug: please report it)."""


class OutputError(LrpError):
    """An output file or directory cannot be written."""


class DeviceError(LrpError):
    """The requested execution device is not available."""


class LrpWarning(UserWarning):
    """Something works but deserves attention (a composite entry that matches nothing, a mixed install); the
    command line prints it as one line on stderr."""


def internal_error(node, exc: BaseException) -> InternalError:
    """An unexpected exception while handling ``node`` (None: outside any node) as one line that names it."""
    where = f"node {node.name} ({node.domain or 'ai.onnx'}::{node.op_type})" if node is not None else "onnx-lrp"
    text = " ".join(str(exc).split())[:200]
    return InternalError(f"internal error in {where}: {type(exc).__name__}: {text}. This is a bug in onnx-lrp "
                         "(or a malformed model it failed to recognise); please report it with the model")
