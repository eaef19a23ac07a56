"""The loader's proto layer: the model as onnx writes it, read, checked, fixed up and written back. The only package
of onnx_lrp that imports ``onnx``; the rest edits onnx_ir graphs.

- :mod:`.read`: a path, bytes, ``ModelProto`` or onnx_ir model -> a checked, prepared onnx_ir model.
- :mod:`.external_data`: external tensors, their files checked; :mod:`.digest`: a model's files and their SHA-256.
- :mod:`.fixups`: what exporters and older IR versions write, fixed up; :mod:`.inputs`: inputs the caller binds
  to constants or gives sizes.
- :mod:`.prepare`: check (:mod:`.check`), upgrade (:mod:`.opset`) and shape-infer (:mod:`.shapes`).
- :mod:`.serialize`: onnx_ir <-> protobuf bytes (or the parts of a large model); :mod:`.save`: writing model files.
- :mod:`.evaluate`: onnx's reference evaluator for constant folding and a Loop's condition.
- :mod:`.graphs`: every graph and node of a ``ModelProto``.
"""
