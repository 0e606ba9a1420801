"""Evaluation episodes as one animated GIF: what a robot user watches before reading a success rate.

Every episode is a tile of a grid (up to `MAX_TILES`, the first ones, in prompt order), each showing the first
camera's frames as the simulator rendered them, one per action. The grid plays all episodes side by side from their
first frame; an episode that ended holds its last frame. Each tile has a border: grey while the episode runs, then
green if it succeeded and red if it did not, so a glance at the last frame reads the success rate. GIF (Pillow, a
core dependency) rather than MP4: every browser and Markdown viewer plays it, and it needs no video codec.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, ImageOps

MAX_TILES = 16  # a 4 x 4 grid; more episodes make tiles too small to read
BORDER = 3
RUNNING, SUCCEEDED, FAILED = (128, 128, 128), (40, 180, 40), (200, 40, 40)


@dataclass
class EpisodeFilm:
    """One episode's frames (its first camera after reset and after every action) and whether it succeeded."""

    seed: int
    frames: list[Image.Image] = field(default_factory=list)
    success: bool = False


def write_episodes_gif(films: list[EpisodeFilm], path: Path, *, fps: int = 10, scale: int = 2) -> Path:
    """`films` as a grid animation at `path` (written to `<path>.partial`, then renamed: a failed write leaves no
    half a file). Each frame is scaled `scale` times (nearest neighbour: a 96-pixel simulator frame stays sharp)."""
    if not films or not all(film.frames for film in films):
        raise ValueError(f"{path}: no episode frames to write")
    shown = films[:MAX_TILES]
    columns = math.ceil(math.sqrt(len(shown)))
    rows = math.ceil(len(shown) / columns)
    width, height = shown[0].frames[0].size
    tile = (width * scale + 2 * BORDER, height * scale + 2 * BORDER)
    length = max(len(film.frames) for film in shown)
    canvas = []
    for t in range(length):
        grid = Image.new("RGB", (columns * tile[0], rows * tile[1]), (0, 0, 0))
        for index, film in enumerate(shown):
            ended = t >= len(film.frames) - 1
            colour = RUNNING if not ended else SUCCEEDED if film.success else FAILED
            frame = film.frames[min(t, len(film.frames) - 1)].convert("RGB")
            if frame.size != (width, height):
                frame = frame.resize((width, height))
            framed = ImageOps.expand(frame.resize((width * scale, height * scale), Image.NEAREST), BORDER, colour)
            grid.paste(framed, ((index % columns) * tile[0], (index // columns) * tile[1]))
        canvas.append(grid)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.partial")
    # The default path is in a run directory, which someone else may have shared: a file or link already at the
    # partial name is removed (not followed) and the new one created exclusively, so no link redirects the write.
    partial.unlink(missing_ok=True)
    try:
        with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb") as out:
            # The last frame is held for a second, so the looped GIF shows the outcome before it starts again.
            durations = [int(1000 / fps)] * (len(canvas) - 1) + [1000]
            canvas[0].save(out, format="GIF", save_all=True, append_images=canvas[1:], duration=durations, loop=0,
                           optimize=False)
        partial.replace(path)  # a link at `path` itself is replaced, not followed
    finally:
        partial.unlink(missing_ok=True)
    return path
