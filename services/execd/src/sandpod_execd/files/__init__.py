"""Files in a sandbox: execd's domain logic for the ``fs`` family, free of NATS and wire messages.

Data flows one way: the ``fs`` handlers resolve the client's path with :class:`~.paths.Paths`
(``/workspace`` alias, hostile-path checks), call a blocking function from :mod:`.ops`,
:mod:`.listing`, :mod:`.search` or :mod:`.atomic` on a worker thread, and turn the plain
results (:class:`~.entries.Entry` and friends) into replies. Every ``OSError`` becomes a typed
``fs.*`` error in exactly one place (:func:`~.paths.os_error`). Uploads (:mod:`.uploads`) are
the only state kept between requests: a temporary file per upload, written chunk by chunk and
renamed over the target on commit, so no file is ever held in memory whole.
"""
