"""Files edgerl writes and reads back: atomic writes, checkpoints, tolerant CSV reading,
side files, logs, and the replay on disk.
"""
