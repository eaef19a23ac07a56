"""Placeholder entry point; replaced by the full command line."""
def main():
    raise SystemExit("onnx-lrp: command line not built yet")
