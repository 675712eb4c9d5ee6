"""The service around a training run: the session that `edgerl train` and the daemon share
(clocks, the load monitor, evaluations, status), the daemon with sd_notify and its watchdog, and
logging set-up."""
