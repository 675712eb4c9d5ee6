"""What a user watches: the game as the trainer shows it (viewer.py: a pygame window, or the
console through render.py, which also draws `edgerl play`; attach.py follows the trainer's
stream for it and for `edgerl serve`), and the learning curves of run
directories (curves.py reads them, plot.py draws them). The frame stream itself is
:mod:`edgerl.stream`."""
