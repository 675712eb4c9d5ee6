"""A training run: the loop (train.py) with its actor and pipeline, the hooks that follow it
(evaluations, the best policy, metrics, status, checkpoints), the run directory, autotune, the
quick settings and stop requests. The session and service around it are :mod:`edgerl.service`."""
