"""The model as onnx writes it: read (path, bytes, ModelProto; external data), check (text fields, tensors, types,
opset), fix up what exporters and older IR versions write (initializers listed as inputs, negative dims, contrib ops
in the default domain, function ops expanded, newer op versions relabelled), bind constant inputs and fix input
shapes, lift to MIN_OPSET, infer shapes, and serialise back. Also onnx's reference evaluator and shape inference for
:mod:`onnx_lrp.load.fold` and the control-flow pass. The only module of onnx_lrp that imports ``onnx``.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
import onnx.reference
import onnx_ir as ir
from onnx import shape_inference, version_converter

from ..core.errors import InputError, ModelError, UnsupportedError
from ..core.files import atomic_write
from ..core.graph import captured_values
from . import external


MIN_OPSET = 17
MAX_OPSET = 23
# the highest opset the installed onnx knows: MAX_OPSET+1 .. KNOWN_OPSET are read as MAX_OPSET where every op means
# the same there (``relabel_newer_opset``); a higher one does not exist yet and is refused
KNOWN_OPSET = onnx.defs.onnx_opset_version()


def read_proto(source) -> onnx.ModelProto:
    """A ModelProto from a path, bytes or a ModelProto, with external data; one-line errors."""
    if isinstance(source, onnx.ModelProto):
        return source
    if isinstance(source, ir.Model):
        return ir.serde.serialize_model(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) == 0:
            raise ModelError("model bytes are empty; pass the content of an .onnx file")
        try:
            return onnx.load_model_from_string(bytes(source))
        except Exception as exc:  # protobuf DecodeError and friends
            raise ModelError(f"model bytes are not a valid ONNX model ({type(exc).__name__}); "
                             "check that the file is complete") from None
    if not isinstance(source, (str, os.PathLike)):
        raise ModelError(f"model must be a path, bytes or an onnx.ModelProto, not {type(source).__name__}")
    path = Path(os.fspath(source))
    if not path.exists():
        raise ModelError(f"model file {path} not found; check the path")
    if path.is_dir():
        raise ModelError(f"model path {path} is a directory; give the .onnx file")
    if path.stat().st_size == 0:
        raise ModelError(f"model file {path} is empty; re-export the model")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ModelError(f"model file {path} is not a valid ONNX model ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else 'cannot parse'}); it may be truncated or "
                         "not an ONNX file") from None
    external_constants_to_initializers(proto)
    # external data stays in its files (memory-mapped by the onnx_ir model, read by onnxruntime): checked, not loaded
    check_files(proto, path.parent, f"model file {path}")
    return proto


def external_constants_to_initializers(proto: onnx.ModelProto) -> int:
    """A Constant node whose tensor is in an external file (torch.onnx writes large constants so, e.g. a LLaMA's
    rotary table exported with transformers 5) becomes an initializer of its output's name, in its graph: the data
    stays in its file and is checked, memory-mapped and handed to onnxruntime like every external weight (the checker
    cannot resolve an attribute's external file for a graph read without its data)."""
    moved = 0
    for g in all_graphs(proto):
        kept = []
        for node in g.node:
            value = next((a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR),
                         None)
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.attribute) == 1 and \
                    value is not None and value.data_location == onnx.TensorProto.EXTERNAL and len(node.output) == 1:
                t = onnx.TensorProto()
                t.CopyFrom(value)
                t.name = node.output[0]
                g.initializer.append(t)
                moved += 1
            else:
                kept.append(node)
        if len(kept) != len(g.node):
            del g.node[:]
            g.node.extend(kept)
    return moved


def data_files(path) -> list[Path]:
    """The external data files a model file names (each once)."""
    path = Path(path)
    proto = read_proto(path)
    names = {e.value for t in external_tensors(proto) for e in t.external_data if e.key == "location"}
    return [path.parent / n for n in sorted(names)]


def model_sha256(path) -> str:
    """SHA-256 of a model file and the external data files it names.

    A model without external data gets the plain digest of its file (as snapshots written before recorded it); with
    external data, each data file's name and bytes follow the graph file's bytes, in name order, so a changed weight
    in a data file changes the digest.
    """
    import hashlib

    files = [Path(path)] + data_files(path)
    h = hashlib.sha256()
    for i, f in enumerate(files):
        if i:
            h.update(b"\0" + f.name.encode() + b"\0")
        with open(f, "rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def data_folder(source) -> Path | None:
    """The folder a model file's external data paths are relative to (None for bytes and protos)."""
    if isinstance(source, (str, os.PathLike)):
        return Path(os.fspath(source)).resolve().parent
    return None


# ---------------------------------------------------------------------------------------------- external data
COPY_CHUNK = 1 << 26  # bytes copied at once by save_large()


def external_tensors(proto: onnx.ModelProto):
    """Every initializer (main graph, subgraphs) whose data is in an external file."""
    for g in all_graphs(proto):
        for t in g.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                yield t


def all_graphs(proto: onnx.ModelProto):
    """The main graph and every subgraph (If / Loop / Scan bodies, nested), each once; a graph's subgraphs are
    found before it is handed out, so its caller may edit its nodes."""
    stack = [proto.graph]
    while stack:
        g = stack.pop()
        for node in g.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    stack.append(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(a.graphs)
        yield g




def check_files(proto: onnx.ModelProto, folder: Path, name: str) -> int:
    """One-line ModelError unless every external tensor's data file is inside ``folder`` and holds the bytes the
    tensor points at; returns the external bytes."""
    total = 0
    root = folder.resolve()
    sizes: dict[Path, int] = {}
    for t in external_tensors(proto):
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        path = (folder / location).resolve()
        if not location or os.path.isabs(location) or (root not in path.parents and path != root):
            raise ModelError(f"{name}: initializer {t.name!r} points at external data {location!r} outside the "
                             "model's folder; keep the data files beside the model")
        if path not in sizes:
            if not path.is_file():
                raise ModelError(f"{name}: the external data file {location} of initializer {t.name!r} is missing; "
                                 "keep the data files beside the model")
            sizes[path] = path.stat().st_size
        try:
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else sizes[path] - offset
        except ValueError:
            raise ModelError(f"{name}: initializer {t.name!r} has an invalid external data offset or length; the "
                             "file is corrupt (re-export it)") from None
        if offset < 0 or length < 0 or offset + length > sizes[path]:
            raise ModelError(f"{name}: initializer {t.name!r} reads bytes {offset}..{offset + length} of {location}, "
                             f"which has {sizes[path]}; the data file is truncated (copy it again)")
        total += length
    return total




def light_proto(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with its large or external initializers as typed graph inputs (no data copied): what the ONNX
    checker and type checks read; the model itself is unchanged."""
    light = onnx.ModelProto()
    for f in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(light, f, getattr(proto, f))
    light.opset_import.extend(proto.opset_import)
    light.functions.extend(proto.functions)
    g, src = light.graph, proto.graph
    g.name = src.name
    g.node.extend(src.node)
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    names = {v.name for v in src.input}
    for init in src.initializer:
        small = int(np.prod(init.dims, dtype=np.float64)) <= external.LIGHT
        if init.data_location != onnx.TensorProto.EXTERNAL and small:
            g.initializer.append(init)
        elif init.name not in names:
            g.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return light




def save_large(parts: external.Parts, path) -> None:
    """Write a large model as ``path`` + ``path.data`` (every external tensor's bytes copied there, in chunks),
    both via temporary files renamed at the end (no half-written output)."""
    path = Path(path)
    data_name = path.name + ".data"
    proto = onnx.load_model_from_string(parts.model_bytes)
    tmp_model = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp_data = path.with_name(f".{data_name}.tmp{os.getpid()}")
    try:
        with open(tmp_data, "wb") as out:
            for t in external_tensors(proto):
                info = {e.key: e.value for e in t.external_data}
                pad = (-out.tell()) % 4096  # page-aligned: onnxruntime can map each tensor
                out.write(b"\0" * pad)
                offset = out.tell()
                if info.get("location") == external.MEMORY:
                    out.write(memoryview(np.ascontiguousarray(parts.arrays[t.name])).cast("B"))
                else:  # "length" is optional: the rest of the file (torch.onnx writes one file per tensor so)
                    src, start = Path(parts.folder) / info["location"], int(info.get("offset", 0))
                    _copy_range(src, start, int(info["length"]) if "length" in info else src.stat().st_size - start,
                                out)
                del t.external_data[:]
                out.truncate()  # a trailing hole becomes part of the file
                for k, val in (("location", data_name), ("offset", str(offset)), ("length", str(out.tell() - offset))):
                    e = t.external_data.add()
                    e.key, e.value = k, val
        tmp_model.write_bytes(serialize_proto(proto))
        os.replace(tmp_data, path.with_name(data_name))
        os.replace(tmp_model, path)
    finally:
        for tmp in (tmp_model, tmp_data):
            if tmp.exists():
                tmp.unlink()




def _copy_range(src: Path, offset: int, length: int, out) -> None:
    """Copy ``length`` bytes of ``src`` from ``offset`` to ``out`` in chunks; all-zero chunks become holes of the
    file (sparse weights, e.g. pruned ones, take no disk)."""
    zeros = bytes(COPY_CHUNK)
    with open(src, "rb") as f:
        f.seek(offset)
        left = length
        while left:
            chunk = f.read(min(COPY_CHUNK, left))
            if not chunk:
                raise ModelError(f"external data file {src} ended early; copy it again")
            if chunk == zeros[:len(chunk)]:
                out.seek(len(chunk), 1)
            else:
                out.write(chunk)
            left -= len(chunk)


def initializers_not_inputs(proto: onnx.ModelProto) -> onnx.ModelProto:
    """IR <= 3 exporters list every initializer among the graph inputs (an input with a default value): those are
    parameters, taken with their stored value, so the only inputs left are the ones the caller must feed."""
    inits = {t.name for t in proto.graph.initializer}
    if not any(v.name in inits for v in proto.graph.input):
        return proto
    kept = [v for v in proto.graph.input if v.name not in inits]
    if not kept:
        return proto  # every input has a default: nothing would be left to explain; the plan says so
    proto = onnx.ModelProto.FromString(proto.SerializeToString()) if proto.ByteSize() < (1 << 31) - 1 else proto
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    proto.ir_version = max(proto.ir_version, 4)  # IR >= 4 lets initializers stand alone
    return proto


def negative_dims_dynamic(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Some exporters (paddle2onnx) write a dynamic dimension as ``dim_value: -1``; make it a named dynamic one."""
    def negative(vs):
        return any(d.HasField("dim_value") and d.dim_value < 0 for v in vs if v.type.HasField("tensor_type")
                   for d in v.type.tensor_type.shape.dim)

    if not negative(list(proto.graph.input) + list(proto.graph.output) + list(proto.graph.value_info)):
        return proto
    proto = onnx.ModelProto.FromString(proto.SerializeToString()) if proto.ByteSize() < (1 << 31) - 1 else proto
    values = list(proto.graph.input) + list(proto.graph.output) + list(proto.graph.value_info)
    for v in values:
        if not v.type.HasField("tensor_type") or not v.type.tensor_type.HasField("shape"):
            continue
        for i, d in enumerate(v.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value < 0:
                d.dim_param = f"{v.name}_dim{i}"  # dim_value and dim_param are one field: this clears the -1
    return proto


def opset_of(proto: onnx.ModelProto) -> int:
    for imp in proto.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 0


def _check_text(proto: onnx.ModelProto, name: str) -> None:
    """Names, op types and domains must be valid UTF-8 (protobuf hands invalid ones over as bytes)."""
    bad = _bad_text(proto, "model")
    if bad is not None:
        raise ModelError(f"{name}: {bad} is not valid UTF-8 text; the file is corrupt (re-export it)")
    for init in proto.graph.initializer:
        _check_tensor(init, name)


def _bad_text(msg, where: str) -> str | None:
    """The first string field (names, op types, domains, doc strings ...) that protobuf handed over as bytes."""
    for fd, value in msg.ListFields():
        repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
        if fd.type == fd.TYPE_STRING:
            if any(isinstance(v, bytes) for v in (value if repeated else [value])):
                return f"{where}.{fd.name}"
        elif fd.type == fd.TYPE_MESSAGE:
            for k, item in enumerate(value if repeated else [value]):
                label = getattr(item, "name", "") if fd.name in ("node", "input", "output", "initializer") else ""
                index = f"[{label if isinstance(label, str) and label else k}]" if repeated else ""
                found = _bad_text(item, f"{where}.{fd.name}{index}")
                if found:
                    return found
    return None


def _check_tensor(t: onnx.TensorProto, name: str) -> None:
    """The data of an initializer must hold exactly prod(dims) values (else every later read of it fails)."""
    if t.data_location == onnx.TensorProto.EXTERNAL or t.data_type in (onnx.TensorProto.STRING,
                                                                        onnx.TensorProto.UNDEFINED):
        return
    count = int(np.prod(list(t.dims), dtype=np.float64))
    if any(d < 0 for d in t.dims):
        raise ModelError(f"{name}: initializer {t.name!r} has a negative dimension {list(t.dims)}; the file is corrupt")
    try:
        np_dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type))
    except Exception:  # noqa: BLE001 - an unknown or sub-byte type: left to onnxruntime
        return
    if np_dtype.itemsize == 0 or t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return
    if t.HasField("raw_data"):
        have = len(t.raw_data) / np_dtype.itemsize
    else:
        fields = [f for f in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data") if
                  len(getattr(t, f))]
        have = len(getattr(t, fields[0])) if fields else 0
        if np_dtype.kind == "c":
            have /= 2
    if have != count:
        raise ModelError(f"{name}: initializer {t.name!r} holds {have:g} values for dimensions {list(t.dims)} "
                         f"({count}); the file is corrupt (re-export it)")


def prepare_proto(proto: onnx.ModelProto, name: str = "model") -> onnx.ModelProto:
    """Check the model, lift it to MIN_OPSET, infer shapes."""
    if len(proto.graph.node) == 0:
        raise ModelError(f"{name}: the graph has no nodes; is this the right file?")
    _check_text(proto, name)
    proto = contrib_to_ms_domain(proto)
    try:
        onnx.checker.check_model(light_proto(proto))  # weights by type and shape: no 2 GiB limit
    except Exception as exc:
        raise ModelError(f"{name} fails the ONNX checker: {str(exc).splitlines()[0]}") from None
    opset = opset_of(proto)
    if opset == 0:
        raise ModelError(f"{name} imports no default-domain opset; re-export it with a standard exporter")
    if opset > KNOWN_OPSET:
        raise ModelError(f"{name} imports opset {opset}, which does not exist yet: the installed onnx "
                         f"{onnx.__version__} knows opsets up to {KNOWN_OPSET} (onnx-lrp reads {MAX_OPSET + 1}-"
                         f"{KNOWN_OPSET} as {MAX_OPSET} where the ops are unchanged); re-export the model with opset "
                         f"{MAX_OPSET} or lower")
    proto = expand_function_ops(proto, opset)
    if opset > MAX_OPSET:
        proto = relabel_newer_opset(proto, opset, name)
    if opset < 7:
        proto = _legacy_prelu_slopes(proto)
    if opset < MIN_OPSET:
        try:
            proto = version_converter.convert_version(proto, MIN_OPSET)
        except Exception as exc:
            raise ModelError(f"{name}: cannot convert opset {opset} to {MIN_OPSET} ({str(exc).splitlines()[0]}); "
                             f"re-export the model with opset >= {MIN_OPSET}") from None
    try:
        shape_inference.infer_shapes(proto, check_type=False, strict_mode=True, data_prop=False)
    except Exception as exc:
        if "existing shape differ" in str(exc):
            # the exporter's value_info contradicts the ops (jax2onnx 0.17 leaves NHWC shapes on values its layout
            # pass made NCHW): drop the intermediate shapes and infer them from the ops
            proto = onnx.ModelProto.FromString(proto.SerializeToString())
            del proto.graph.value_info[:]
        elif "Incompatible dimensions" in str(exc):  # e.g. a declared input size the graph's weights do not fit
            where = " ".join(str(exc).split())
            first = re.search(r"\(op_type:[^)]*\): \[ShapeInferenceError\] Incompatible dimensions[^(]*", where)
            where = first.group(0).strip() if first else where
            raise ModelError(f"{name}: shape inference finds the graph inconsistent ({where[:200]}); the declared "
                             "input shapes do not fit the rest of the graph: fix them (--input-shape) or re-export "
                             "the model") from None
    try:
        proto = shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:
        raise ModelError(f"{name}: shape inference failed ({str(exc).splitlines()[0]})") from None
    _check_types(proto, name)
    return _fill_same_shape(proto)


# onnxruntime contrib ops that its transformer optimiser writes in the default domain, where the ONNX checker rejects
# them: moved to com.microsoft, where the ort_fused pass splits them into standard ops
DEFAULT_DOMAIN_CONTRIB = ("SimplifiedLayerNormalization",)


def contrib_to_ms_domain(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` with :data:`DEFAULT_DOMAIN_CONTRIB` nodes of the main graph in com.microsoft (or
    ``proto`` itself when it has none)."""
    if not any(n.op_type in DEFAULT_DOMAIN_CONTRIB and n.domain in ("", "ai.onnx") for n in proto.graph.node):
        return proto
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    for n in proto.graph.node:
        if n.op_type in DEFAULT_DOMAIN_CONTRIB and n.domain in ("", "ai.onnx"):
            n.domain = "com.microsoft"
    if not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return proto


def _legacy_prelu_slopes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Opset <= 6 PRelu took a 1-D slope of C values per channel (axis 1, legacy broadcasting); from opset 7 it
    broadcasts from the last axis, so the converted model would apply it along W (or fail). Such slopes become
    [C, 1, ...] (the pytorch-converted PReLU models of the onnx wheel)."""
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in list(proto.graph.input) + list(proto.graph.value_info)
             if v.type.tensor_type.HasField("shape")}
    inits = {t.name: t for t in proto.graph.initializer}
    for node in proto.graph.node:
        if node.op_type != "PRelu" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        slope, rank = inits.get(node.input[1]), ranks.get(node.input[0])
        if slope is None or len(slope.dims) != 1 or slope.dims[0] <= 1 or rank is None or rank < 3:
            continue
        arr = onnx.numpy_helper.to_array(slope)
        per_channel = onnx.numpy_helper.from_array(arr.reshape((-1,) + (1,) * (rank - 2)),
                                                   name=slope.name + "/per_channel")
        if per_channel.name not in inits:
            proto.graph.initializer.append(per_channel)
            inits[per_channel.name] = per_channel
        node.input[1] = per_channel.name
    return proto


def _all_nodes(proto: onnx.ModelProto):
    """Every node of the main graph, its subgraphs (If/Loop/Scan bodies) and the model's local functions."""
    for f in proto.functions:
        yield from f.node
    for g in all_graphs(proto):
        yield from g.node


# ops defined by an ONNX function and without a handler of their own: replaced by their function body (primitive
# ops with handlers) before anything else; Attention is how exporters write scaled dot-product attention from
# opset 23 on
EXPAND = ("Attention", "RotaryEmbedding", "Swish")
_EXPAND_DOMAIN = "lrp.expand"


def expand_function_ops(proto: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """The nodes of the main graph whose op is in EXPAND, inlined as the function ONNX defines them by (for the
    node's attributes and input types); nodes whose input types are unknown stay (and are refused later)."""
    if not any(n.op_type in EXPAND and n.domain in ("", "ai.onnx") for n in proto.graph.node):
        return proto
    try:
        inferred = shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    except Exception:
        return proto
    g = inferred.graph
    types = {v.name: v.type for v in list(g.input) + list(g.value_info) + list(g.output)}
    for t in g.initializer:
        types[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))
    functions = []
    for k, node in enumerate(g.node):
        if node.op_type not in EXPAND or node.domain not in ("", "ai.onnx") or any(
                i and i not in types for i in node.input):
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, "")
            if schema.has_context_dependent_function:
                body = onnx.FunctionProto.FromString(schema.get_context_dependent_function_with_opset_version(
                    opset, node.SerializeToString(),
                    [types[i].SerializeToString() if i else onnx.TypeProto().SerializeToString() for i in node.input]))
            elif schema.has_function:
                body = schema.get_function_with_opset_version(opset)
                body = onnx.FunctionProto.FromString(body) if isinstance(body, bytes) else body
            else:
                continue
        except Exception:
            continue
        body.domain, body.name = _EXPAND_DOMAIN, f"{node.op_type}_{k}"
        node.domain, node.op_type = _EXPAND_DOMAIN, body.name
        functions.append(body)
    if not functions:
        return proto
    inferred.functions.extend(functions)
    inferred.opset_import.append(onnx.helper.make_opsetid(_EXPAND_DOMAIN, 1))
    try:
        out = onnx.inliner.inline_local_functions(inferred)
    except Exception:
        return proto
    for i in [i for i, imp in enumerate(out.opset_import) if imp.domain == _EXPAND_DOMAIN][::-1]:
        del out.opset_import[i]
    return out


def _signature(schema):
    return ([(i.name, i.option, i.type_str) for i in schema.inputs],
            [(o.name, o.option, o.type_str) for o in schema.outputs])


def newer_op_reason(node: onnx.NodeProto, opset: int) -> str | None:
    """Why a default-domain node of a model at ``opset`` > MAX_OPSET cannot be read as the same op at MAX_OPSET,
    or None. It can when its schema is unchanged since an opset <= MAX_OPSET, or when the newer version only
    widened the type constraints and added attributes (the node must leave them at their defaults); the tensor
    types are checked against the older schema afterwards (``relabel_newer_opset``)."""
    try:
        new = onnx.defs.get_schema(node.op_type, opset, "")
    except Exception:
        return f"not an operator of opset {opset}"
    if new.since_version <= MAX_OPSET:
        return None
    try:
        old = onnx.defs.get_schema(node.op_type, MAX_OPSET, "")
    except Exception:
        return f"new in opset {new.since_version} (onnx-lrp knows opsets up to {MAX_OPSET})"
    changed = f"changed in opset {new.since_version} (onnx-lrp knows opsets up to {MAX_OPSET})"
    if _signature(new) != _signature(old):
        return f"{changed}: its inputs or outputs differ"
    for key, attr in old.attributes.items():
        other = new.attributes.get(key)
        if other is None or other.type != attr.type or other.default_value != attr.default_value:
            return f"{changed}: attribute {key} differs"
    added = [a.name for a in node.attribute if a.name not in old.attributes]
    if added:
        return f"{changed}: sets the newer attribute(s) {', '.join(added)}"
    old_types = {t.type_param_str: set(t.allowed_type_strs) for t in old.type_constraints}
    new_types = {t.type_param_str: set(t.allowed_type_strs) for t in new.type_constraints}
    if any(k not in new_types or not v <= new_types[k] for k, v in old_types.items()):
        return f"{changed}: its type constraints differ"
    return None


def relabel_newer_opset(proto: onnx.ModelProto, opset: int, name: str = "model") -> onnx.ModelProto:
    """A model importing an opset above MAX_OPSET, relabelled to MAX_OPSET when every default-domain op means the
    same there (``newer_op_reason``); else UnsupportedError listing every op that does not (one row per op)."""
    bad: dict[str, dict] = {}
    for node in _all_nodes(proto):
        if node.domain not in ("", "ai.onnx") or node.op_type in bad:
            continue
        why = newer_op_reason(node, opset)
        if why:
            bad[node.op_type] = dict(name=node.name or node.output[0], op_type=node.op_type, domain="",
                                     opset=opset, reason=why)
    if bad:
        raise UnsupportedError(list(bad.values()), f"{name} imports opset {opset}; re-export it with opset "
                                                   f"{MAX_OPSET} or lower")
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    for imports in [proto.opset_import] + [f.opset_import for f in proto.functions]:
        for imp in imports:
            if imp.domain in ("", "ai.onnx"):
                imp.version = min(imp.version, MAX_OPSET)
    try:  # a tensor type the newer version added (float8e8m0, int2, ...) does not fit the older schema
        shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "unsupported type" in msg:
            raise ModelError(f"{name} imports opset {opset} and uses a tensor type onnx-lrp's opset {MAX_OPSET} "
                             f"does not know ({msg}); re-export it with opset {MAX_OPSET} or lower") from None
    return proto


def _check_types(proto: onnx.ModelProto, name: str) -> None:
    """Refuse a standard op given a data type its schema does not allow (e.g. a Conv on int32: an input whose type
    was changed), and ops whose input shapes contradict each other (a declared input size the rest of the graph was
    not exported for). Strict inference lists the error of each node; ops of other domains have no schema and
    pass."""
    light = onnx.ModelProto()  # large initializers matter by type and shape only: typed inputs, no data copied
    light.ir_version = proto.ir_version
    light.opset_import.extend(proto.opset_import)
    light.functions.extend(proto.functions)
    g = light.graph
    g.node.extend(proto.graph.node)
    for i, node in enumerate(g.node):  # so that the error names every node it lists (as the loader will)
        node.name = node.name or f"{node.op_type}_{i}"
    g.input.extend(proto.graph.input)
    # the declared shapes of the graph's outputs are annotations (onnxruntime only warns when they are wrong, and
    # some exporters write wrong ones: ddddocr's CRNN declares 1 x ? for a T x 1 x 8210 output): their types are
    # kept, their shapes are not held against the graph
    g.output.extend(_types_only(proto.graph.output))
    g.value_info.extend(proto.graph.value_info)
    names = {v.name for v in proto.graph.input}
    for init in proto.graph.initializer:
        if int(np.prod(init.dims, dtype=np.float64)) <= 4096:
            g.initializer.append(init)
        elif init.name not in names:
            g.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    try:
        shape_inference.infer_shapes(light, check_type=True, strict_mode=True)
    except Exception as exc:  # onnx.shape_inference.InferenceError
        text = " ".join(str(exc).split())
        if "type" in text.lower() and ("typestr" in text or "Type Error" in text or "unsupported type" in text
                                      or "inconsistent type" in text or "type mismatch" in text.lower()):
            raise ModelError(f"{name}: {text[:300]}; the data types do not fit the ops (re-export the model)") \
                from None
        # a complaint about a node's input shapes; not one about its attributes (the op handlers name those
        # "malformed" more precisely), nor one from inside a function body's inference (onnx's own expansions,
        # e.g. MeanVarianceNormalization's, draw some on valid models)
        conflict = next((m for m in SHAPE_CONFLICT.finditer(str(exc))
                         if "Inference error" not in m.group(3) and "ttribute" not in m.group(3)), None)
        if conflict:
            op, node, why = conflict.groups()
            raise ModelError(f"{name}: the shapes do not fit at node {node} ({op}: {why.strip()}), from the "
                             f"declared input shape(s) {_declared(proto)}; give the shapes the model was exported "
                             "for (--input-shape NAME=DxD..., input_shapes=) or fix the export") from None


def _types_only(values) -> list:
    """Copies of value infos with their element types and without their shapes."""
    out = []
    for v in values:
        w = onnx.ValueInfoProto()
        w.CopyFrom(v)
        if w.type.HasField("tensor_type"):
            w.type.tensor_type.ClearField("shape")
        out.append(w)
    return out


# strict shape inference's complaint about a node's input shapes (not a type left unknown after an earlier error)
SHAPE_CONFLICT = re.compile(r"\(op_type:(\w+), node name: ([^\n]*?)\): \[ShapeInferenceError\] ([^\n]*)")


def _declared(proto: onnx.ModelProto) -> str:
    def dims(v):
        shape = v.type.tensor_type.shape
        return "x".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in shape.dim)
    inits = {t.name for t in proto.graph.initializer}
    return ", ".join(f"{v.name} {dims(v)}" for v in proto.graph.input if v.name not in inits)


def eval_node(node: ir.Node, opset: int, given: dict | None = None) -> list[np.ndarray] | None:
    """Evaluate one node whose inputs are all constant (or ``given``: input index -> array) with onnx's reference
    evaluator."""
    proto = ir.serde.serialize_node(node)
    feeds, inputs = {}, []
    for i, v in enumerate(node.inputs):
        if v is None:
            continue
        arr = given[i] if given and i in given else v.const_value.numpy()
        feeds[v.name] = arr
        inputs.append(onnx.helper.make_tensor_value_info(v.name, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype),
                                                         arr.shape))
    outputs = [onnx.helper.make_empty_tensor_value_info(o.name) for o in node.outputs]
    graph = onnx.helper.make_graph([proto], "fold", inputs, outputs)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    try:
        results = onnx.reference.ReferenceEvaluator(model).run(None, feeds)
    except Exception:
        return None
    return [np.asarray(r) for r in results]


def eval_nodes(nodes: list, inputs: list, outputs: list, opset: int):
    """A function evaluating a few nodes of one graph (a control-flow body's condition) from arrays for ``inputs``
    (values read by the nodes; every other value they read must be a constant), returning ``outputs``' arrays or
    None; None when some other input is not a constant. The control-flow pass's evaluator (built once per Loop, run
    once per iteration)."""
    produced = {id(o) for n in nodes for o in n.outputs}
    given = {id(v) for v in inputs}
    inits, seen = [], set()
    for n in nodes:
        for v in list(n.inputs) + captured_values(n):
            if v is None or id(v) in produced or id(v) in given or id(v) in seen:
                continue
            seen.add(id(v))
            if v.const_value is None:
                return None
            inits.append(onnx.numpy_helper.from_array(v.const_value.numpy(), v.name))
    ins = [onnx.helper.make_empty_tensor_value_info(v.name) for v in inputs]
    outs = [onnx.helper.make_empty_tensor_value_info(o.name) for o in outputs]
    graph = onnx.helper.make_graph([ir.serde.serialize_node(n) for n in nodes], "cond", ins, outs, inits)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    try:
        evaluator = onnx.reference.ReferenceEvaluator(model)
    except Exception:
        return None
    names = [v.name for v in inputs]

    def run(arrays: list) -> list[np.ndarray] | None:
        try:
            return [np.asarray(r) for r in evaluator.run(None, dict(zip(names, arrays)))]
        except Exception:
            return None
    return run


def _copy_for_inputs(proto: onnx.ModelProto, given, arg: str, what: str, verb: str, name: str):
    """A copy of ``proto`` to change some graph inputs of, and its inputs by name; ``given`` (input name -> ``what``)
    must be a dict naming only inputs of the model (else one line, ``verb`` saying what could not be done)."""
    if not isinstance(given, dict):
        raise InputError(f"{arg} must be a dict of input name -> {what}, not {type(given).__name__}")
    names = [v.name for v in proto.graph.input]
    unknown = [k for k in given if k not in names]
    if unknown:
        raise InputError(f"{name}: cannot {verb.format(', '.join(map(repr, unknown)))}: the model's inputs are "
                         f"{', '.join(names)}")
    proto = onnx.ModelProto.FromString(proto.SerializeToString()) if proto.ByteSize() < (1 << 31) - 1 else proto
    return proto, {v.name: v for v in proto.graph.input}


def bind_constants(proto: onnx.ModelProto, constants: dict | None, name: str = "model") -> onnx.ModelProto:
    """Graph inputs the caller fixes (``constants``: input name -> value), made initializers of the input's type:
    a sample rate or a flag that an If branches on. The bound inputs are no longer inputs of the model."""
    if not constants:
        return proto
    proto, by_name = _copy_for_inputs(proto, constants, "constants", "value", "bind {} to a constant", name)
    inits = {t.name for t in proto.graph.initializer}
    for key, value in constants.items():
        vi = by_name[key]
        tt = vi.type.tensor_type
        try:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
            arr = np.asarray(value)
            if arr.dtype == object or (arr.dtype.kind == "f" and dtype.kind in "iub" and
                                       not np.all(arr == np.round(arr))):
                raise ValueError
            arr = arr.astype(dtype)
        except (ValueError, TypeError):
            raise InputError(f"{name}: constant for input {key!r} must be a number or array convertible to its type "
                             f"{onnx.helper.tensor_dtype_to_string(tt.elem_type)}, not {value!r}") from None
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim] if tt.HasField("shape") \
            else None
        if dims is not None and arr.shape != tuple(dims):
            if arr.size == int(np.prod([d or 1 for d in dims])) and len(dims) == len(dims) and None not in dims:
                arr = arr.reshape(dims)
            elif len(dims) != arr.ndim or any(d is not None and d != a for d, a in zip(dims, arr.shape)):
                raise InputError(f"{name}: constant for input {key!r} has shape {list(arr.shape)}; the input's is "
                                 f"{['?' if d is None else d for d in dims]}")
        if key in inits:
            raise InputError(f"{name}: input {key!r} already has a default value (an initializer); it is a parameter")
        proto.graph.initializer.append(onnx.numpy_helper.from_array(arr, key))
    kept = [v for v in proto.graph.input if v.name not in constants]
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    proto.ir_version = max(proto.ir_version, 4)
    return proto


def fix_input_shapes(proto: onnx.ModelProto, shapes: dict | None, name: str = "model") -> onnx.ModelProto:
    """Dynamic dimensions of graph inputs fixed by the caller (``shapes``: input name -> sizes, one per axis) before
    shape inference, so that shape checks (an ``If`` on ``x.shape[0] == 1``) fold. A static dimension keeps its size:
    giving it another one, an unknown input or another rank is refused. Two inputs sharing a symbolic dimension
    (``batch``) must get the same size for it; inputs not given take the sizes of the symbolic dimensions fixed."""
    if not shapes:
        return proto
    proto, by_name = _copy_for_inputs(proto, shapes, "input_shapes", "sizes", "fix the shape of {}", name)
    symbols: dict[str, tuple[int, str]] = {}
    for key, sizes in shapes.items():
        given = sizes
        try:
            arr = np.asarray(given, dtype=np.float64)
            if isinstance(given, (str, bytes)) or arr.ndim != 1 or not np.all((arr >= 1) & (arr <= 2 ** 62) & (arr == np.round(arr))):
                raise ValueError
            sizes = [int(a) for a in arr]
        except (ValueError, TypeError, OverflowError):
            raise InputError(f"{name}: the shape for input {key!r} must be positive integer sizes, one per axis "
                             f"(e.g. (1, 512)), not {given!r}") from None
        vi = by_name[key]
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            raise InputError(f"{name}: input {key!r} has no declared rank; its shape cannot be fixed")
        dims = vi.type.tensor_type.shape.dim
        have = "x".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims)
        if len(dims) != len(sizes):
            raise InputError(f"{name}: the shape {'x'.join(map(str, sizes))} for input {key!r} has rank {len(sizes)}; "
                             f"the input's is {have or '(a scalar)'} (rank {len(dims)})")
        for axis, (d, s) in enumerate(zip(dims, sizes)):
            if d.HasField("dim_value"):
                if d.dim_value != s:
                    raise InputError(f"{name}: input {key!r} has the static size {d.dim_value} on axis {axis}, not "
                                     f"{s}; only its dynamic dimensions ({have}) can be fixed")
                continue
            if d.dim_param:
                prev = symbols.setdefault(d.dim_param, (s, key))
                if prev[0] != s:
                    raise InputError(f"{name}: inputs {prev[1]!r} and {key!r} share the dimension {d.dim_param!r}; "
                                     f"it was fixed to {prev[0]} and {s}")
            d.Clear()
            d.dim_value = s
    for vi in proto.graph.input:  # the inputs not given that share a fixed symbolic dimension take its size
        if vi.name not in shapes and vi.type.HasField("tensor_type"):
            for d in vi.type.tensor_type.shape.dim:
                if not d.HasField("dim_value") and d.dim_param in symbols:
                    size = symbols[d.dim_param][0]
                    d.Clear()
                    d.dim_value = size
    return proto


_SAME_SHAPE = {"GroupNormalization"}  # function ops whose output type and shape onnx's inference leaves unknown


def _fill_same_shape(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Type and shape of the outputs of ops that keep their input's (where shape inference gives none), then
    inference again so that they reach the values downstream."""
    g = proto.graph
    typed = {v.name: v for v in list(g.input) + list(g.value_info) + list(g.output)
             if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}
    added = 0
    for node in g.node:
        if node.op_type in _SAME_SHAPE and node.domain in ("", "ai.onnx") and node.input and node.input[0] in typed \
                and node.output and node.output[0] not in typed:
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(typed[node.input[0]])
            vi.name = node.output[0]
            g.value_info.append(vi)
            added += 1
    if not added:
        return proto
    try:
        return shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    except Exception:
        return proto


def to_ir(proto: onnx.ModelProto, folder=None) -> ir.Model:
    """The onnx_ir model; external tensors read their files in ``folder`` (memory-mapped, when first used)."""
    return external.attach(ir.serde.deserialize_model(proto), folder)


def read(source, name: str, constants: dict | None = None, input_shapes: dict | None = None) -> ir.Model:
    """Read, fix up, bind ``constants``, fix ``input_shapes``, check, upgrade and shape-infer a model; as onnx_ir."""
    proto = negative_dims_dynamic(initializers_not_inputs(read_proto(source)))
    proto = prepare_proto(fix_input_shapes(bind_constants(proto, constants, name), input_shapes, name), name)
    try:
        return to_ir(proto, data_folder(source))
    except Exception as exc:  # onnx_ir.serde.SerdeError: a field it cannot read (e.g. a corrupt attribute)
        cause = exc
        while cause.__cause__ is not None:
            cause = cause.__cause__
        raise ModelError(f"{name}: the model cannot be read ({type(cause).__name__}: "
                         f"{' '.join(str(cause).split())[:150]}); the file is corrupt (re-export it)") from None


def condition_evaluator(model: ir.Model):
    """``evaluate(nodes, inputs, outputs)`` for the control-flow pass (:func:`eval_nodes` at the model's opset)."""
    opset = model.opset_imports.get("", MIN_OPSET)
    return lambda nodes, ins, outs: eval_nodes(nodes, ins, outs, opset)


def inferred_dims(model: ir.Model) -> list[tuple[str, list]]:
    """(value name, dims) for the values onnx's shape inference (with data propagation) gives a shape; large
    parameters only matter by their type and shape: they are passed as typed inputs, not as data."""
    with external.weightless(model):  # no weight serialised
        proto = ir.serde.serialize_model(model)
    keep = []
    for init in proto.graph.initializer:
        if int(np.prod(init.dims)) > 4096 or init.data_location == onnx.TensorProto.EXTERNAL:
            proto.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        else:
            keep.append(init)
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(keep)
    try:
        proto = shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    except Exception:
        return []
    found = []
    for vi in list(proto.graph.value_info) + list(proto.graph.output):
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        found.append((vi.name, [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                for d in vi.type.tensor_type.shape.dim]))
    return found


def reinferred(model: ir.Model) -> ir.Model | None:
    """The model through :func:`prepare_proto` again (shape inference over ops split since), or None."""
    try:
        with external.weightless(model):  # shapes only: no weight serialised
            proto = prepare_proto(ir.serde.serialize_model(model), "model")
    except Exception:
        return None
    return to_ir(proto)


def deserialize(model_bytes: bytes, folder=None) -> ir.Model:
    """An ``onnx_ir`` model from bytes written by :func:`serialize` (no checks, no canonization); ``folder``: where
    its external data is (:attr:`external.Parts.folder`)."""
    return to_ir(onnx.load_model_from_string(model_bytes), folder)


def min_ir_version(model_proto: onnx.ModelProto) -> int:
    return max(8, onnx.helper.find_min_ir_version_for(list(model_proto.opset_import), ignore_unknown=True))


def serialize(model: ir.Model) -> bytes:
    """The model as bytes, IR version set explicitly (onnxruntime 1.31 reads IR <= 13); external tensors stay
    references to their files."""
    return serialize_proto(ir.serde.serialize_model(model))


def serialize_proto(proto: onnx.ModelProto) -> bytes:
    proto.ir_version = min(min_ir_version(proto), 13)
    return proto.SerializeToString()


def serialize_parts(model: ir.Model) -> external.Parts:
    """The model as onnxruntime receives it: bytes alone for a small model; for one with external data or over
    1 GiB of weights, the graph, the folder of its data files and its large in-memory tensors (never one protobuf
    of every weight)."""
    external.drop_unused(model)
    external.lower_upcasts(model)  # float16 / bfloat16 weights handed over in their type
    return external.split(model, serialize) if external.is_large(model) else external.Parts(serialize(model))


def save_parts(parts: external.Parts, path) -> None:
    """Write ``path`` (and ``path.data`` for a large model) atomically."""
    if parts.large:
        save_large(parts, path)
    else:
        save_bytes(parts.model_bytes, path)


def check(model_bytes: bytes) -> None:
    """Run onnx.checker on serialized bytes (used by tests and ``rewrite``)."""
    onnx.checker.check_model(onnx.load_model_from_string(model_bytes), full_check=True)


def save_bytes(model_bytes: bytes, path) -> None:
    """Write atomically: a temporary file beside the target, then rename."""
    atomic_write(path, model_bytes)
