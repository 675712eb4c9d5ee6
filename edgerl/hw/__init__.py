"""The machine, and nothing about training: Jetson platform detection, clocks, tegrastats
parsing, the load sources and monitor, how busy the CPUs are, torch's device, precision and
threads here (device.py, versions.py), glibc's allocator keeping freed memory
(allocator.py), and how long PyTorch's idle OpenMP threads spin (openmp.py).

Every file is read below ``EDGERL_HW_ROOT`` (default ``/``) and every tool is looked up on PATH, so
tests run the real code against captured files and small stand-in executables.
"""
