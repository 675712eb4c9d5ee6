"""edgerl: train DQN agents on the device itself (NVIDIA Jetson), watch them, export to TensorRT."""

from edgerl.hw.openmp import short_spin

__version__ = "0.1.0"

# Before any of edgerl imports torch: libgomp reads how long its idle threads spin when it loads.
short_spin()
