"""The declarative model: load repo YAML, validate it, expose typed resources."""
