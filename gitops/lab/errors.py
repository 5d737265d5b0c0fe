"""Lab errors."""
from gitops.errors import GitopsError


class LabError(GitopsError):
    """The lab could not be set up, inspected or torn down."""
