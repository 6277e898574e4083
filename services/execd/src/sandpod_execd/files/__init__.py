"""Files in a sandbox: execd's domain logic for the ``fs`` family, free of NATS and wire messages.

Data flows one way: the ``fs`` handlers map the client's path with :class:`~.paths.Paths`
(``/workspace`` alias, hostile-path checks) to a path in the sandbox's root, call a blocking
function from :mod:`.ops`, :mod:`.copying`, :mod:`.listing`, :mod:`.search` or :mod:`.atomic` on
a worker thread, and turn the plain results (:class:`~.entries.Entry` and friends) into replies.
Those functions resolve paths only through :class:`~.rooted.Root` (``openat2`` with
``RESOLVE_IN_ROOT`` for a jailed sandbox) and then work through descriptors, so a sandbox process
racing to swap a directory for a link cannot send execd outside the sandbox. Every ``OSError``
becomes a typed ``fs.*`` error in exactly one place (:func:`~.paths.os_error`). Uploads
(:mod:`.uploads`) are the only state kept between requests: a temporary file per upload, written
chunk by chunk and renamed over the target on commit, so no file is ever held in memory whole.
"""
