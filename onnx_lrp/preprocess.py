"""Inputs in Python as the command line reads them: ``load_image(path, size=224, mean=..., std=...)`` is the array
``onnx-lrp explain MODEL IMAGE --size 224 --mean ... --std ...`` feeds the model (the aspect ratio kept: the
shorter side fitted, the centre cut, as torchvision's ``Resize`` + ``CenterCrop``; ``crop=False`` squashes).

    import onnx_lrp
    from onnx_lrp.preprocess import load_image, IMAGENET_MEAN, IMAGENET_STD
    ex = onnx_lrp.Explainer("resnet18.onnx", composite="epsilon-gamma-box")
    x = load_image("cat.jpg", 224, mean=IMAGENET_MEAN, std=IMAGENET_STD, model=ex)
    res = ex.explain(x, target="tabby cat")
"""
from __future__ import annotations

from .io.inputs import IMAGENET_MEAN, IMAGENET_STD
from .io.preprocess import load_image

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "load_image"]
