"""Stand-ins for the contract's image error family, until it lands in ``sandpod_contract.errors``.

The image-pull branch adds the ``image.*`` family to the contract at the same time as this
module is written; these two classes carry the same codes so callers can already branch on them.
When both branches merge, this module is replaced by imports from the contract (same names, same
codes), and nothing that catches them changes.
"""

from __future__ import annotations

from sandpod_contract.errors import SandpodError

__all__ = ["ImageLayerRefused", "ImageUnsupported"]


class ImageUnsupported(SandpodError):
    """``details.media_type`` (or ``details.compress``) names what is not understood."""

    code = "image.unsupported"
    summary = "the image uses a media type or format Sandpod does not support"


class ImageLayerRefused(SandpodError):
    """``details.reason`` says why (``path_escape``, ``too_large``, ``corrupt``, ...) and
    ``details.entry`` names the tar entry, so a caller can report the hostile part precisely."""

    code = "image.layer_refused"
    summary = "the layer tarball is corrupt or tries to write outside its layer; refused"
