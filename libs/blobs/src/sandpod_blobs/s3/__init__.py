"""The S3-compatible blob store: settings, the SigV4-signed client, the store.

Construct it from the environment once at start::

    store = S3BlobStore(S3Settings.from_env(os.environ))
"""

from sandpod_blobs.s3.settings import S3Settings
from sandpod_blobs.s3.store import S3BlobStore

__all__ = ["S3BlobStore", "S3Settings"]
