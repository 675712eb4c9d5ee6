"""Measuring speed: ``edgerl bench`` (each stage alone, then the whole loop), its loop and
replay benchmarks, and what a step costs in arithmetic. The autotune that picks env.num_envs is
a training decision: :mod:`edgerl.run.autotune`."""
