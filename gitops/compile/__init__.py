"""Desired-state compilation: pure functions from the repo model and recorded state."""
