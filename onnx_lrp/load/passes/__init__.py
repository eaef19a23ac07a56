"""The loading passes, one module per deployed or exported form (a package of modules where a form has several
parts: :mod:`.canonize`, :mod:`.ort_fused`). Each is an ``onnx_ir`` in-place pass
(:class:`onnx_lrp.load.builder.LoadPass`: ``pass_(model) -> PassResult``) whose notes and refusals go to the model's
:class:`~onnx_lrp.load.builder.Report`; each imports only :mod:`onnx_lrp.load.builder` and :mod:`onnx_lrp.core`
besides its own package, never the pipeline, another pass or a later stage.

- :mod:`.ort_fused`: onnxruntime's fused ops (offline optimisation, the transformer optimiser), one table; the
  attention, norm and fused-layer splits in modules of their own.
- :mod:`.qdq`, :mod:`.qoperator`, :mod:`.dynamic_quant`: quantized models (QDQ, QOperator, dynamic quantization).
- :mod:`.float16`: float16 / bfloat16 upcast to float32.
- :mod:`.control_flow`: static Loop / Scan unrolled, If with a constant condition inlined.
- :mod:`.canonize`: the canonizers of what exporters write (BatchNorm folding, explicit pads, ...), one module
  per kind.

Supporting a new deployed form is one new module here with one :class:`LoadPass`, added to the pipeline's list in
:mod:`onnx_lrp.load`, and a test beside it.
"""
