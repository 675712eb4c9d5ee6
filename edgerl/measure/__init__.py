"""Measuring speed: ``edgerl bench`` (each stage alone, then the whole loop), its loop and
replay benchmarks, and the autotune that picks env.num_envs from the figures.
"""
