"""The ``onnx-lrp`` command line (installed as ``onnx_lrp.cli``)."""
