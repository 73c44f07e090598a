"""Uploaded dataset files: validated before they are accepted, owned by a project."""
