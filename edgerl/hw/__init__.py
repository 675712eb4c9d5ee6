"""Jetson hardware: platform detection, clocks, tegrastats parsing, the load sources and monitor.

Every file is read below ``EDGERL_HW_ROOT`` (default ``/``) and every tool is looked up on PATH, so
tests run the real code against captured files and small stand-in executables.
"""
