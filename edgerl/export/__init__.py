"""Exporting a learned policy: ONNX (anywhere) and TensorRT engines (on the device that runs them).

``run.py`` holds the export command (checkpoint -> ONNX -> optional TensorRT engine, each checked
by playing it through :mod:`edgerl.policies`, which also reads the files back); ``onnx.py`` and
``tensorrt.py`` write the formats; ``common.py`` what they share. This file imports nothing, so
that loading one format does not load the rest.
"""
