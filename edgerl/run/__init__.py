"""A training run: the loop and its saved state, the session and service around it, hooks
(evaluations, the best policy, metrics, status), and the process plumbing (signals, sd_notify,
child processes, the run directory).
"""
