"""The training loop (train.py) with its actor and pipelines, checkpoints, autotune, the settled
config and stop requests; what it reports and keeps is :mod:`edgerl.report`. The session and
service around it are :mod:`edgerl.service`."""
