"""The episodes' GIF (oxrl/vla/video.py) in a run directory someone else may have shared: a link planted at the
file's name or at its partial name is replaced, never written through."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from oxrl.vla.video import EpisodeFilm, write_episodes_gif


def film(success: bool) -> EpisodeFilm:
    frames = [Image.fromarray(np.full((8, 8, 3), value, np.uint8)) for value in (0, 120, 240)]
    return EpisodeFilm(0, frames, success)


@pytest.mark.parametrize("planted", ["eval_episodes.gif", "eval_episodes.gif.partial"])
def test_a_planted_link_is_replaced_not_written_through(tmp_path, planted):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    os.symlink(victim, tmp_path / planted)
    path = write_episodes_gif([film(True), film(False)], tmp_path / "eval_episodes.gif")
    assert victim.read_text() == "keep me"
    assert not path.is_symlink() and Image.open(path).format == "GIF"
    assert not (tmp_path / "eval_episodes.gif.partial").exists()


def test_no_frames_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no episode frames to write"):
        write_episodes_gif([], tmp_path / "x.gif")
    assert not (tmp_path / "x.gif").exists()
