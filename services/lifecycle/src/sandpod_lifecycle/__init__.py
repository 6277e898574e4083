"""The lifecycle service: Sandbox resources driven to their spec (API, reconciler, runtimes)."""
