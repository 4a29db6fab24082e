import json
import os

import pytest
import torch

from transduce.checkpoint import checkpoint_name, checkpoint_step, load_model, save_model
from transduce.config import Config, ModelConfig
from transduce.model import Transformer


def test_save_load_round_trip(tmp_path):
    config = Config(model=ModelConfig(src_vocab_size=30, n_layers=1, d_model=16, d_ff=32, n_heads=2))
    model = Transformer(config.model).eval()
    save_model(model, config, tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["checksums.json", "config.json", "model.safetensors"]
    assert json.loads((tmp_path / "m" / "config.json").read_text())["model"]["d_model"] == 16
    loaded, loaded_config = load_model(tmp_path / "m")
    assert loaded_config == config
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    # the tied embedding is still one tensor after loading
    assert loaded.encoder.embed is loaded.decoder.embed
    src = torch.tensor([[5, 6, 3]])
    assert torch.equal(model(src, src), loaded(src, src))


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads the process's mappings from /proc (Linux)")
def test_a_loaded_model_holds_no_mapping_of_its_weights_file(tmp_path):
    # each tensor safetensors reads keeps the file mapped, with the pages it touched, while it lives
    config = Config(model=ModelConfig(src_vocab_size=30, n_layers=1, d_model=16, d_ff=32, n_heads=2))
    save_model(Transformer(config.model), config, tmp_path / "m")
    loaded, _ = load_model(tmp_path / "m")
    weights = str((tmp_path / "m" / "model.safetensors").resolve())
    with open("/proc/self/maps") as f:
        assert not [line for line in f if line.rstrip().endswith(weights)]
    assert loaded.decoder.layers[0].feed_forward.w_1.weight.abs().sum() > 0


def test_weights_file_is_safetensors_not_pickle(tmp_path):
    config = Config(model=ModelConfig(src_vocab_size=30, n_layers=1, d_model=16, d_ff=32, n_heads=2))
    save_model(Transformer(config.model), config, tmp_path)
    head = (tmp_path / "model.safetensors").read_bytes()[:16]
    header_len = int.from_bytes(head[:8], "little")
    assert head[8:9] == b"{" and header_len > 0  # safetensors: u64 header length + JSON header


def test_missing_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path)


def test_checkpoint_step_reads_back_the_name():
    for step in (0, 7, 1000, 12_345_678):
        assert checkpoint_step(checkpoint_name(step)) == step
    assert checkpoint_step(f"runs/x/checkpoints/{checkpoint_name(900)}.damaged") == 900


def test_atomic_dir_errors_name_the_users_path_not_the_temporary_one(tmp_path):
    """`export ... -o OUT` where OUT cannot be made: the error names OUT, and nothing is left."""
    from transduce.checkpoint import atomic_dir

    (tmp_path / "a_file").write_text("x\n")
    for out, what in [
        (tmp_path / "nodir" / "out", "No such file or directory"),
        (tmp_path / "a_file" / "out", "Not a directory"),
        (tmp_path / "a_file", "Not a directory"),
    ]:
        with pytest.raises(OSError) as e:
            with atomic_dir(out):
                raise AssertionError("not reached")
        assert f"{e.value.filename}: {e.value.strerror}" == f"{out}: {what}"
    assert [p.name for p in tmp_path.iterdir()] == ["a_file"] and (tmp_path / "a_file").read_text() == "x\n"


@pytest.mark.parametrize("damage", ["a flipped bit", "truncated"])
def test_a_damaged_weights_file_is_named_whether_or_not_it_still_reads(tmp_path, damage):
    # the checksum is computed in a thread while the model is read: a flipped bit reads (and is
    # found as the read ends), a truncated file fails to read (and the damage is named instead)
    from transduce.checkpoint.files import DamagedCheckpoint

    config = Config(model=ModelConfig(src_vocab_size=30, n_layers=1, d_model=16, d_ff=32, n_heads=2))
    save_model(Transformer(config.model), config, tmp_path / "m")
    path = tmp_path / "m" / "model.safetensors"
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: len(data) - 64]
    else:
        data[len(data) - 8] ^= 0x10  # inside the last tensor
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedCheckpoint, match="model.safetensors: damaged"):
        load_model(tmp_path / "m")


def test_read_tensor_reads_what_safetensors_reads_without_mapping_the_file(tmp_path):
    """`model_dir.read_tensor` reads a tensor's bytes itself (the file never mapped, whose pages would
    count in the process's memory): every dtype a model holds, 0-d and empty tensors, bit for bit
    safetensors' own; the file's header read once while the file is unchanged."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from transduce.checkpoint import model_dir

    torch.manual_seed(0)
    tensors = {
        "f32": torch.randn(5, 3),
        "bf16": torch.randn(4, 2).bfloat16(),
        "f16": torch.randn(3).half(),
        "i64": torch.arange(7),
        "i8": torch.randint(-128, 127, (2, 3), dtype=torch.int8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    }
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    with safe_open(str(path), "pt") as f:
        theirs = {name: f.get_tensor(name).clone() for name in f.keys()}  # not held mapped
    model_dir._header.cache_clear()
    for name, want in theirs.items():
        got = model_dir.read_tensor(path, name)
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), name
    assert model_dir._header.cache_info().misses == 1
    maps = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else ""
    assert str(path) not in maps
