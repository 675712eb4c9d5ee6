"""Files edgerl writes and reads back, whatever is in them: atomic writes, regular-file checks,
tolerant CSV reading, side files that may fail without stopping training, child processes'
files, and the checkpoint record (typed, versioned, migrated). The replay saves itself
(:mod:`edgerl.memories.replay.store`)."""
