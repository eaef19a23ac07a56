"""The ground floor every stage stands on: errors, the relevance model's interface names, the facts of onnx_ir values
and nodes, the Emitter, the loader's notes to the rewriter (``meta``) and file helpers. Imports nothing of the stages."""
