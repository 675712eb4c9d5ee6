"""edgerl: train DQN agents on the device itself (NVIDIA Jetson), watch them, export to TensorRT."""

__version__ = "0.1.0"
