"""Running a built relevance model: the onnxruntime session, the runner (feeds, targets, results), the conservation
check, the diagnosis of non-finite relevance and the gap to the deployed model."""
