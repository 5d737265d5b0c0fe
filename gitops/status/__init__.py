"""The status branch: outcomes, observed state, encrypted artifacts and controller state in git."""
