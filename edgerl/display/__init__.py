"""Showing the game: the trainer's frame stream (stream.py), drawing (render.py), the viewer."""
