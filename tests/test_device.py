"""One rule for --device, in training and inference alike (`transduce.device.resolve_device`)."""

import pytest
import torch

from transduce.device import resolve_device
from transduce.errors import UsageError


def test_cpu_and_auto():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    assert resolve_device("auto", local_rank=0) == resolve_device("auto")


@pytest.mark.parametrize("name", ["tpu", "cuda:x", "cuda:", "gpu", ""])
def test_unknown_names_are_one_line_errors(name):
    with pytest.raises(UsageError, match="unknown device") as e:
        resolve_device(name)
    assert "\n" not in str(e.value) and "cuda:N" in str(e.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where CUDA is absent")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_where_there_is_none(name):
    with pytest.raises(UsageError, match="CUDA is not available"):
        resolve_device(name, local_rank=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_is_the_local_ranks_gpu_and_cuda_n_is_gpu_n():
    assert resolve_device("cuda") == torch.device("cuda", 0)
    n = torch.cuda.device_count()
    assert resolve_device("cuda", local_rank=n - 1) == torch.device("cuda", n - 1)
    assert resolve_device(f"cuda:{n - 1}", local_rank=0) == torch.device("cuda", n - 1)
    with pytest.raises(UsageError, match="no cuda"):
        resolve_device(f"cuda:{n}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_device_leaves_cudnn_attention_out():
    torch.backends.cuda.enable_cudnn_sdp(True)
    resolve_device("cuda")
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()


def test_the_cpu_leaves_the_attention_backends_alone():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    resolve_device("cpu")
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
