"""Template builds: the layer cache (:mod:`.cache`), committing a builder's writable layer
(:mod:`.commit`), the executor that runs a template's steps in builder sandbox
(:mod:`.executor`) and the reconcile loop over templates (:mod:`.loop`)."""
