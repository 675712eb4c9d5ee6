"""Showing the game: the trainer's frame stream (stream.py) and its reader (reader.py), drawing
(render.py), the viewer (viewer.py)."""
