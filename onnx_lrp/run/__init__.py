"""Running a built relevance model: the onnxruntime session, the runner (feeds, targets, results), the conservation
check, the diagnosis of non-finite relevance, the gap to the deployed model, and the launch from a model and the
Explainer's arguments (build, session, the float32 fallback)."""
