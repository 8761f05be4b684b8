"""Replay memory held by the learner (prioritized sequence replay for R2D2)."""
