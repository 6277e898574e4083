"""The layer unpacker's errors: the contract's image family, re-exported for ``layers``' modules.

They began here as stand-ins while the contract's ``image.*`` family was written on another
branch; now they are the contract's classes (``image.unsupported``, ``image.layer_refused``,
both ``ImageError``s), so a caller catching either module's names catches the same errors.
``details.reason`` of ``ImageLayerRefused`` says why (``path_escape``, ``too_large``,
``corrupt``...) and ``details.entry`` names the tar entry when one is at fault.
"""

from __future__ import annotations

from sandpod_contract.errors import ImageLayerRefused, ImageUnsupported

__all__ = ["ImageLayerRefused", "ImageUnsupported"]
