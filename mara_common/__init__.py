"""The shared bottom layer: project paths, profiles and configs, tracking, plotting, threads.

Every other package may import from here; nothing here imports them.
"""
