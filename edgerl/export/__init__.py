"""Exporting a learned policy: ONNX (anywhere) and TensorRT engines (on the device that runs them).

``run.py`` holds the export command (checkpoint -> ONNX -> optional TensorRT engine, each checked);
``onnx.py`` and ``tensorrt.py`` the formats and their policies for ``edgerl play``; ``common.py``
what they share. This file imports nothing, so that loading one format does not load the rest.
"""
