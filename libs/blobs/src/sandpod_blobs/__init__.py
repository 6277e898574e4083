"""Sandpod's content-addressed blob store (snapshot layers) behind one seam.

:class:`BlobStore` is the Protocol callers hold; keys are ``sha256:<hex>`` digests and every read
is verified against its key before it lands on disk. Implementations:

- :class:`JetStreamBlobStore` -- embedded mode, a JetStream object-store bucket through the bus
  (``await JetStreamBlobStore.open(bus, bucket)``);
- :class:`S3BlobStore` -- clusters, any S3-compatible endpoint
  (``S3BlobStore(S3Settings.from_env(os.environ))``);
- :class:`MemoryBlobStore` -- an in-memory fake for tests.
"""

from sandpod_blobs.digest import BlobRef, check_digest, hash_file, is_digest
from sandpod_blobs.interface import BlobStore
from sandpod_blobs.jetstream import DEFAULT_BUCKET, JetStreamBlobStore
from sandpod_blobs.memory import MemoryBlobStore
from sandpod_blobs.s3 import S3BlobStore, S3Settings
from sandpod_blobs.verify import VerifiedFile

__all__ = [
    "DEFAULT_BUCKET",
    "BlobRef",
    "BlobStore",
    "JetStreamBlobStore",
    "MemoryBlobStore",
    "S3BlobStore",
    "S3Settings",
    "VerifiedFile",
    "check_digest",
    "hash_file",
    "is_digest",
]
