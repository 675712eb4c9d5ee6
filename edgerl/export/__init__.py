"""Exporting a learned policy: ONNX (anywhere) and TensorRT engines (on the device that runs them).

``run.py`` holds the export command (checkpoint -> ONNX -> optional TensorRT engine, each checked
by playing it through :mod:`edgerl.policies`); ``onnx.py`` and ``tensorrt.py`` the formats;
``common.py`` what they share. This file imports nothing, so that loading one format does not load
the rest.
"""
