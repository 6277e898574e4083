"""Snapshots of sandboxes (``SandboxSnapshot``): the API, the capture controller, restores."""
