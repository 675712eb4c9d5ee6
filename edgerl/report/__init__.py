"""What a training run reports and keeps: the hooks the loop calls (hooks.py), its metrics and
figures, the balance of actor and learner, episodes counted, evaluations and the best policy, the
status file, the run directory, the time estimate and the quick settings. Nothing here imports the
loop (:mod:`edgerl.run`), which calls these."""
