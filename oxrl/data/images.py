"""Images of vision-language rows: decoded once, while the rows are parsed, to bounded RGB `PIL` images.

A row's `images` column is a list of images (a single image counts as a list of one). Each image may be:
  * a `PIL.Image.Image`;
  * `bytes` of an encoded image (PNG, JPEG, ...);
  * an object `{"bytes": ..., "path": ...}`, what a Hugging Face `datasets` Image column gives
    (the bytes win when present, else the path is read);
  * a string: a `data:image/...;base64,...` URI; else a file path (relative paths are relative to the
    folder of the dataset file, or to the working directory for hub and folder datasets; `~` is expanded);
  * else a string of base64 image data (long and all base64 characters, as no file path is).

An image file is a regular file of at most MAX_IMAGE_FILE_BYTES (64 MiB), read no further: a FIFO, a device
such as /dev/zero or /dev/urandom, or a symlink to one is refused by what it is, a larger file by its size.

An image with more than `data.max_image_pixels` pixels is scaled down, keeping its aspect ratio, to at
most that many; a smaller one is never scaled up. The model's processor resizes again, but decoding
to this bound first keeps memory bounded however large the files are.

Anything unreadable is an `ImageError` from `decode_image`, and a `DataError` naming the file, the row
and `images[i]` from `decode_images`.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import os
import re
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from oxrl.data.errors import DataError
from oxrl.files import InputFileError, read_bounded

# A string this long made only of base64 characters is image data, not a path (a path has a dot, or is short).
_BASE64 = re.compile(r"[A-Za-z0-9+/\s]+={0,2}\s*")
_MIN_BASE64_CHARS = 64
_DATA_URI = re.compile(r"data:image/[\w.+-]+;base64,", re.IGNORECASE)
# Larger than any photograph's encoding (a 100-megapixel JPEG is about 30 MB); pixels beyond
# `data.max_image_pixels` are scaled away after decoding anyway.
MAX_IMAGE_FILE_BYTES = 64 << 20


class ImageError(ValueError):
    """An image value that cannot be decoded; the message says why."""


def decode_image(value: Any, *, root: Path | None, max_pixels: int) -> Image.Image:
    """`value` (any form of the module docstring) as a fully loaded RGB image of at most `max_pixels` pixels."""
    data = None if isinstance(value, Image.Image) else _encoded_bytes(value, root)
    try:
        if data is None:
            # A copy, so that the caller's image is untouched; it decodes one that `datasets` opened lazily.
            image = value.convert("RGB")
        else:
            with Image.open(io.BytesIO(data)) as opened:
                image = opened.convert("RGB")  # decodes every pixel now, so that a broken file fails here
    except UnidentifiedImageError as error:
        raise ImageError("not an image (cannot identify image file)") from error
    except Image.DecompressionBombError as error:  # a small file that would decode to billions of pixels
        raise ImageError(f"refused as a decompression bomb: {error}") from error
    except (OSError, SyntaxError) as error:  # truncated data; PIL's PNG reader raises SyntaxError for bad chunks
        raise ImageError(f"broken or truncated image data: {error}") from error
    return _bounded(image, max_pixels)


def decode_images(value: Any, *, location: str, row: int, root: Path | None, max_pixels: int) -> list[Image.Image]:
    """A row's `images` column (a list, or one image) decoded; a bad item is a DataError naming `images[i]`."""
    if not isinstance(value, (list, tuple)):
        if not isinstance(value, (str, bytes, dict, Image.Image)):
            raise DataError(location, row, "images", f"expected a list of images, got {type(value).__name__}")
        value = [value]
    decoded = []
    for i, item in enumerate(value):
        try:
            decoded.append(decode_image(item, root=root, max_pixels=max_pixels))
        except ImageError as error:
            raise DataError(location, row, f"images[{i}]", str(error)) from error
    return decoded


def _encoded_bytes(value: Any, root: Path | None) -> bytes:
    """The encoded image file `value` holds or names."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, dict):  # a `datasets` Image: {"bytes": ..., "path": ...}, either may be null
        if value.get("bytes") is not None:
            return _encoded_bytes(value["bytes"], root)
        if isinstance(value.get("path"), str):
            return _read_file(value["path"], root)
        raise ImageError("an image object needs `bytes` or a `path`")
    if not isinstance(value, str):
        accepted = "a path, bytes, a base64 string or data URI, or an image"
        raise ImageError(f"expected {accepted}, got {type(value).__name__}")
    text = value.strip()
    if not text:
        raise ImageError("empty string")
    if text[:5].lower() == "data:":
        if not (uri := _DATA_URI.match(text)):
            raise ImageError(f"a data URI must start data:image/<type>;base64, not {text[:40]!r}")
        return _base64(text[uri.end():], "data URI")
    # os.path.exists, not Path.exists: a long base64 string is an over-long file name, which Path.exists raises on.
    if len(text) >= _MIN_BASE64_CHARS and _BASE64.fullmatch(text) and not os.path.exists(_local(text, root)):
        return _base64(text, "base64 string")
    return _read_file(text, root)


def _local(path: str, root: Path | None) -> Path:
    resolved = Path(path).expanduser()
    return resolved if resolved.is_absolute() or root is None else root / resolved


def _read_file(path: str, root: Path | None) -> bytes:
    resolved = _local(path, root).absolute()
    try:
        return read_bounded(resolved, MAX_IMAGE_FILE_BYTES, "an image file")
    except InputFileError as error:
        raise ImageError(f"{resolved}: {error}") from None
    except FileNotFoundError as error:
        raise ImageError(f"file not found: {resolved}") from error
    except OSError as error:  # a folder, no permission, a name too long
        raise ImageError(f"cannot read {resolved}: {error.strerror or error}") from error


def _base64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)  # MIME base64 breaks lines
    except binascii.Error as error:
        raise ImageError(f"not a valid {what}: {error}") from error


def _bounded(image: Image.Image, max_pixels: int) -> Image.Image:
    """`image` scaled down (aspect ratio kept) to at most `max_pixels` pixels; never scaled up."""
    width, height = image.size
    if width * height <= max_pixels:
        return image
    scale = math.sqrt(max_pixels / (width * height))
    new_width = max(1, min(int(width * scale), max_pixels))
    # Rounding down keeps the product within the bound; the `//` guards float error and very thin images.
    new_height = max(1, min(int(height * scale), max_pixels // new_width))
    return image.resize((new_width, new_height), Image.Resampling.BICUBIC)
